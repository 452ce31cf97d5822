"""CPU kernels of dithering: quantise with stochastic rounding and pack codes, decode by
table, and the codec with error feedback fused in (``encode_feedback``). A code is the
level with the sign in its top bit (set only for a negative input with a non-zero level)."""
import numpy as np
from numba import njit

from gradpress.kernels.cpu.elementwise import compensate
from gradpress.kernels.cpu.norms import INF_BITS, chunk_sum, max_abs_bits
from gradpress.kernels.quantize import code_table, level
from gradpress.kernels.reduction import CHUNK, LANES, pairwise_total
from gradpress.kernels.scaling import norm_from
from gradpress.kernels.rng import draw_bits, uniform24


@njit(inline="always", nogil=True, cache=True)
def _encode_range(x: np.ndarray, first: int, norm: np.float32, s: int, natural: bool,
                  width: int, stream: np.uint64, codes: np.ndarray) -> None:
    """Codes of ``x`` (elements ``first...`` of the array: their random draws) into
    ``codes``; ``first`` is a multiple of the codes per byte."""
    n = x.shape[0]
    per_byte = 8 // width
    sign_bit = 1 << (width - 1)
    norm64 = np.float64(norm)
    for b in range((n + per_byte - 1) // per_byte):
        byte = 0
        for j in range(per_byte):
            i = b * per_byte + j
            if i < n and norm64 > 0.0:
                u = uniform24(draw_bits(stream, np.uint64(first + i)))
                lv = level(abs(np.float64(x[i])), norm64, s, natural, u)
                code = lv | sign_bit if (x[i] < 0 and lv > 0) else lv
                byte |= code << (j * width)
        codes[b] = byte


@njit(nogil=True, cache=True)
def encode(x: np.ndarray, norm: np.float32, s: int, natural: bool, width: int,
           stream: np.uint64, codes: np.ndarray) -> None:
    """Pack the code of every ``x[i]`` (random draw ``i`` of ``stream``) into ``codes``."""
    _encode_range(x, 0, norm, s, natural, width, stream, codes)


@njit(nogil=True, cache=True)
def _feedback_norms(g: np.ndarray, e: np.ndarray, lam: float, square: bool) -> tuple:
    """Pass 1 of ``encode_feedback``: (largest |p| as float32 bits, sum p^2 if ``square``)
    of p = g + lam * e, p living only in a one-chunk scratch."""
    n = g.shape[0]
    chunks = (n + CHUNK - 1) // CHUNK
    squares = np.zeros(chunks)
    p = np.empty(CHUNK, np.float32)
    lanes = np.empty(LANES)
    largest = 0
    for c in range(chunks):
        start, end = c * CHUNK, min((c + 1) * CHUNK, n)
        block = p[:end - start]
        compensate(g[start:end], e[start:end], lam, block)
        largest = max(largest, max_abs_bits(block))
        if square:
            squares[c] = chunk_sum(block, 0, True, lanes)
    return largest, pairwise_total(squares)


@njit(nogil=True, cache=True)
def _encode_feedback(g, e, lam, norm, s, natural, width, stream, codes, e_out) -> None:
    """Pass 2: codes of p and e_out = p - D(c) (``e_out`` may be ``e``)."""
    n = g.shape[0]
    per_byte = 8 // width
    mask = (1 << width) - 1
    table = code_table(norm, s, natural, width)
    p = np.empty(CHUNK, np.float32)
    for start in range(0, n, CHUNK):
        end = min(start + CHUNK, n)
        block = p[:end - start]
        compensate(g[start:end], e[start:end], lam, block)
        _encode_range(block, start, norm, s, natural, width, stream, codes[start // per_byte:])
        for i in range(end - start):
            code = (codes[(start + i) // per_byte] >> ((i % per_byte) * width)) & mask
            e_out[start + i] = block[i] - table[code]


def encode_feedback(g: np.ndarray, e: np.ndarray, lam: float, s: int, natural: bool,
                    normalize: str, width: int, stream: np.uint64, codes: np.ndarray,
                    e_out: np.ndarray) -> np.float32 | None:
    """Error feedback fused into dithering: p = g + lam * e; ``codes`` = C(p);
    e_out = p - D(C(p)). Returns the norm, or None (nothing written) when p has a NaN or
    inf: pass 1's maximum is the check, so ``e_out`` may alias ``e``."""
    max_bits, square_sum = _feedback_norms(g, e, lam, normalize == "l2")
    if max_bits >= INF_BITS:
        return None
    norm = norm_from(normalize, square_sum, max_bits)
    _encode_feedback(g, e, lam, norm, s, natural, width, stream, codes, e_out)
    return norm


@njit(nogil=True, cache=True)
def decode(codes: np.ndarray, table: np.ndarray, width: int, out: np.ndarray,
           accumulate: bool) -> None:
    """``out[i] (+)= table[code i]``."""
    per_byte = 8 // width
    mask = (1 << width) - 1
    for i in range(out.shape[0]):
        code = (codes[i // per_byte] >> ((i % per_byte) * width)) & mask
        if accumulate:
            out[i] += table[code]
        else:
            out[i] = table[code]


@njit(nogil=True, cache=True)
def codes_within(codes: np.ndarray, s: int, width: int, n: int) -> bool:
    """Payload check: every level <= s and the padding bits of the last byte are zero."""
    per_byte = 8 // width
    level_mask = (1 << (width - 1)) - 1
    for b in range(codes.shape[0]):
        byte = codes[b]
        for j in range(per_byte):
            code = (byte >> (j * width)) & ((1 << width) - 1)
            if b * per_byte + j >= n:
                if code:
                    return False
            elif code & level_mask > s:
                return False
    return True
