"""CPU kernels of dithering: quantise with stochastic rounding and pack codes, decode by
table, and the codec with error feedback fused in (``encode_feedback``). A code is the
level with the sign in its top bit (set only for a negative input with a non-zero level)."""
import math

import numpy as np
from numba import njit

from gradpress.kernels.cpu.elementwise import compensate
from gradpress.kernels.cpu.norms import INF_BITS, chunk_sum, max_abs_bits
from gradpress.kernels.quantize import code_table
from gradpress.kernels.reduction import CHUNK, LANES, lane_tree, pairwise_total
from gradpress.kernels.scaling import norm_from
from gradpress.kernels.rng import draw_bits, uniform24


_FRACTION = np.uint64((1 << 52) - 1)
_ONE_BITS = np.uint64(1023 << 52)  # exponent bits of 1.0
_ABS = np.uint32(0x7FFFFFFF)


@njit(inline="always", nogil=True, cache=True)
def _level(magnitude: float, norm: float, s: int, natural: bool, low_scale: float,
           u: float) -> int:
    """``quantize.level`` without branches or libm calls, so that the code loop
    vectorises (3.3x faster): frexp by the float64 bits of t = magnitude / norm, which is
    0 or a normal number here (a float32 over a float32), and ldexp(t, s - 1) as
    t * ``low_scale`` (= 2**(s - 1)), exact for such t. t = 0 has exponent -1022, so it
    takes the low branch with up = 0: level 0, as ``level`` gives. Identical levels:
    tests/compressors/test_reference.py compares the codes with numpy's frexp/ldexp."""
    if natural:
        t = magnitude / norm
        bits = np.float64(t).view(np.uint64)
        exponent = np.int64(bits >> np.uint64(52)) - 1022  # t = mantissa * 2**exponent
        high = exponent >= 2 - s
        low = s - 1 + exponent if high else 0
        # 2 * mantissa - 1: the mantissa bits under the exponent of 1.0, minus 1 (exact)
        up = np.uint64((bits & _FRACTION) | _ONE_BITS).view(np.float64) - 1.0 if high \
            else t * low_scale
    else:
        y = (magnitude * s) / norm  # as quantize.level: the product is exact
        low = np.int64(math.floor(y))
        up = y - low
    return low + 1 if u < up else low


@njit(inline="always", nogil=True, cache=True)
def _code_loop(x: np.ndarray, first: int, norm: float, s: int, natural: bool, width: int,
               stream: np.uint64, out: np.ndarray) -> None:
    sign_bit = 1 << (width - 1)
    low_scale = 2.0 ** (s - 1)
    for i in range(x.shape[0]):
        u = uniform24(draw_bits(stream, np.uint64(first + i)))
        lv = _level(abs(np.float64(x[i])), norm, s, natural, low_scale, u)
        out[i] = lv | sign_bit if (x[i] < 0 and lv > 0) else lv


@njit(inline="always", nogil=True, cache=True)
def _codes(x: np.ndarray, first: int, norm: np.float32, s: int, natural: bool, width: int,
           stream: np.uint64, out: np.ndarray) -> None:
    """Code of every ``x[i]`` (random draw ``first + i``) into ``out``, one per uint8.
    Callers pass slices, so the loop starts at 0 (it vectorises: the hash's 64-bit
    multiplies too). One loop per partition, each with ``natural`` a constant: the loop
    with the test inside ran 41.2 ms for 16M elements in the error-feedback pass, these
    34.0."""
    if norm == 0:
        out[:] = 0
    elif natural:
        _code_loop(x, first, np.float64(norm), s, True, width, stream, out)
    else:
        _code_loop(x, first, np.float64(norm), s, False, width, stream, out)


@njit(inline="always", nogil=True, cache=True)
def _pack(levels: np.ndarray, width: int, codes: np.ndarray) -> None:
    """One code per uint8 -> ``8 // width`` per byte, the first in the low bits (the last
    byte's unused bits zero). One loop per width, with a fixed number of codes per byte
    and no test per code: a loop over bytes with a test per code ran 12-25x slower (it did
    not vectorise)."""
    n = levels.shape[0]
    if width == 8:
        for i in range(n):
            codes[i] = levels[i]
    elif width == 4:
        full = n // 2
        for b in range(full):
            codes[b] = levels[2 * b] | (levels[2 * b + 1] << 4)
        if n % 2:
            codes[full] = levels[n - 1]
    else:
        full = n // 4
        for b in range(full):
            codes[b] = (levels[4 * b] | (levels[4 * b + 1] << 2) | (levels[4 * b + 2] << 4)
                        | (levels[4 * b + 3] << 6))
        if n % 4:
            byte = 0
            for j in range(n % 4):
                byte |= levels[4 * full + j] << (2 * j)
            codes[full] = byte


@njit(nogil=True, cache=True)
def encode(x: np.ndarray, norm: np.float32, s: int, natural: bool, width: int,
           stream: np.uint64, codes: np.ndarray) -> None:
    """Pack the code of every ``x[i]`` (random draw ``i`` of ``stream``) into ``codes``."""
    n = x.shape[0]
    per_byte = 8 // width
    scratch = np.empty(CHUNK, np.uint8)
    for start in range(0, n, CHUNK):  # CHUNK is a multiple of every per_byte
        end = min(start + CHUNK, n)
        levels = scratch[:end - start]
        _codes(x[start:end], start, norm, s, natural, width, stream, levels)
        _pack(levels, width, codes[start // per_byte:])


@njit(inline="always", nogil=True, cache=True)
def _p(g: np.ndarray, e: np.ndarray, lam: float, i: int) -> np.float32:
    """p_i = g_i + lam * e_i as ``elementwise.compensate`` rounds it."""
    if lam == 1.0:
        return g[i] + e[i]
    return np.float32(g[i] + lam * e[i])


@njit(nogil=True, cache=True)
def _feedback_norms(g: np.ndarray, e: np.ndarray, lam: float, square: bool) -> tuple:
    """Pass 1 of ``encode_feedback``: (largest |p| as float32 bits, sum p^2 if ``square``)
    of p = g + lam * e. Full chunks compute p inside the lane loop, never stored (as
    onebit's pass 1); the last, partial chunk goes through a scratch."""
    n = g.shape[0]
    chunks = (n + CHUNK - 1) // CHUNK
    squares = np.zeros(chunks)
    lanes = np.empty(LANES)
    largest = np.uint32(0)
    for c in range(n // CHUNK):
        lanes[:] = 0.0
        for m in range(CHUNK // LANES):
            base = c * CHUNK + m * LANES
            for j in range(LANES):
                v = _p(g, e, lam, base + j)
                largest = max(largest, np.float32(v).view(np.uint32) & _ABS)
                if square:
                    lanes[j] += np.float64(v) * np.float64(v)
        if square:
            squares[c] = lane_tree(lanes)
    start = (n // CHUNK) * CHUNK
    if start < n:
        block = np.empty(n - start, np.float32)
        compensate(g[start:], e[start:], lam, block)
        largest = max(largest, np.uint32(max_abs_bits(block)))
        if square:
            squares[chunks - 1] = chunk_sum(block, 0, True, lanes)
    return largest, pairwise_total(squares)


@njit(nogil=True, cache=True)
def _encode_feedback(g, e, lam, norm, s, natural, width, stream, codes, e_out) -> None:
    """Pass 2: codes of p and e_out = p - D(c) (``e_out`` may be ``e``: each chunk of p
    is computed before its residual overwrites e)."""
    n = g.shape[0]
    per_byte = 8 // width
    table = code_table(norm, s, natural, width)
    p = np.empty(CHUNK, np.float32)
    scratch = np.empty(CHUNK, np.uint8)
    for start in range(0, n, CHUNK):
        end = min(start + CHUNK, n)
        block = p[:end - start]
        compensate(g[start:end], e[start:end], lam, block)
        levels = scratch[:end - start]
        _codes(block, start, norm, s, natural, width, stream, levels)
        _pack(levels, width, codes[start // per_byte:])
        _residual(block, levels, table, e_out[start:end])


@njit(inline="always", nogil=True, cache=True)
def _residual(p: np.ndarray, levels: np.ndarray, table: np.ndarray, e_out: np.ndarray) -> None:
    for i in range(p.shape[0]):
        e_out[i] = p[i] - table[levels[i]]


def encode_feedback(g: np.ndarray, e: np.ndarray, lam: float, s: int, natural: bool,
                    normalize: str, width: int, stream: np.uint64, codes: np.ndarray,
                    e_out: np.ndarray) -> np.float32 | None:
    """Error feedback fused into dithering: p = g + lam * e; ``codes`` = C(p);
    e_out = p - D(C(p)). Returns the norm, or None (nothing written) when p has a NaN or
    inf, or an l2 norm beyond float32: pass 1 is the check, so ``e_out`` may alias ``e``."""
    max_bits, square_sum = _feedback_norms(g, e, lam, normalize == "l2")
    if max_bits >= INF_BITS:
        return None
    norm = norm_from(normalize, square_sum, max_bits)
    if norm is None:
        return None
    _encode_feedback(g, e, lam, norm, s, natural, width, stream, codes, e_out)
    return norm


@njit(inline="always", nogil=True, cache=True)
def _write(codes: np.ndarray, table: np.ndarray, width: int, out: np.ndarray) -> None:
    """``out[i] = table[code i]``: a loop over bytes, each giving its fixed number of codes
    (one loop per width), then the last, partial byte. These vectorise: against a loop
    over codes taking code ``i`` by shifts, 1.9x (12.6M 4-bit codes: 3.6 against 6.7 ms);
    against ``i // per_byte`` and ``i % per_byte`` (an integer division per element)
    4-5x more."""
    n = out.shape[0]
    per_byte = 8 // width
    full = n // per_byte
    if width == 8:
        for i in range(n):
            out[i] = table[codes[i]]
    elif width == 4:
        for b in range(full):
            byte = codes[b]
            out[2 * b] = table[byte & 15]
            out[2 * b + 1] = table[byte >> 4]
    else:
        for b in range(full):
            byte = codes[b]
            for j in range(4):
                out[4 * b + j] = table[(byte >> (2 * j)) & 3]
    mask = (1 << width) - 1
    for i in range(full * per_byte if width < 8 else n, n):
        out[i] = table[(np.int64(codes[full]) >> ((i - full * per_byte) * width)) & mask]


@njit(inline="always", nogil=True, cache=True)
def _add(block: np.ndarray, out: np.ndarray) -> None:
    for i in range(out.shape[0]):
        out[i] += block[i]


@njit(nogil=True, cache=True)
def decode(codes: np.ndarray, table: np.ndarray, width: int, out: np.ndarray,
           accumulate: bool) -> None:
    """``out[i] (+)= table[code i]``. Adding writes each block of ``CHUNK`` values into a
    scratch in cache and adds that: the table lookup added in place compiled to gathers
    (16M 4-bit codes: 15.6 against 8.1 ms). Callers of the inlined loops pass slices, so
    each loop starts at 0 (the same loops over ranges of the whole arrays did not
    vectorise: 26.7 ms)."""
    if not accumulate:
        _write(codes, table, width, out)
        return
    n = out.shape[0]
    per_byte = 8 // width
    scratch = np.empty(min(n, CHUNK), np.float32)
    for start in range(0, n, CHUNK):  # CHUNK is a multiple of every per_byte
        end = min(start + CHUNK, n)
        block = scratch[:end - start]
        _write(codes[start // per_byte:], table, width, block)
        _add(block, out[start:end])


@njit(nogil=True, cache=True)
def codes_within(codes: np.ndarray, s: int, width: int, n: int) -> bool:
    """Payload check: every level <= s and the padding bits of the last byte are zero.
    The bytes whose codes are all elements go through one loop per width, a max over
    their levels with no test per code (it vectorises: 12.5 ms for 12.6M 4-bit codes ran
    as a loop over codes with a test each, more than decoding them); the last byte apart."""
    per_byte = 8 // width
    full = min(n // per_byte, codes.shape[0])
    worst = 0
    if width == 8:
        for b in range(full):
            worst = max(worst, codes[b] & 0x7F)
    elif width == 4:
        for b in range(full):
            byte = codes[b]
            worst = max(worst, max(byte & 7, (byte >> 4) & 7))
    else:
        for b in range(full):
            byte = codes[b]
            worst = max(worst, (byte | (byte >> 2) | (byte >> 4) | (byte >> 6)) & 1)
    if worst > s:
        return False
    level_mask = (1 << (width - 1)) - 1
    for b in range(full, codes.shape[0]):
        byte = codes[b]
        for j in range(per_byte):
            code = (byte >> (j * width)) & ((1 << width) - 1)
            if b * per_byte + j >= n:
                if code:
                    return False
            elif code & level_mask > s:
                return False
    return True
