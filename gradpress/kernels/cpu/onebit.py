"""CPU kernels of the onebit codec: sign bits (1 = negative) in the shared bit layout,
and the codec with error feedback fused in (``encode_feedback``)."""
import math

import numpy as np
from numba import njit

from gradpress.kernels.cpu.elementwise import compensate
from gradpress.kernels.cpu.norms import chunk_sum
from gradpress.kernels.reduction import CHUNK, LANES, lane_tree, pairwise_total
from gradpress.kernels.scaling import scale_from_norms


@njit(inline="always", nogil=True, cache=True)
def _pack_range(x: np.ndarray, bits: np.ndarray, first_byte: int, end_byte: int) -> None:
    """``bits[b]`` bit ``j`` = ``x[8b + j] < 0`` (so sign(0) = sign(-0) = +1)."""
    n = x.shape[0]
    full = min(end_byte, n // 8)
    for b in range(first_byte, full):
        byte = np.uint8(0)
        for j in range(8):
            byte |= np.uint8(x[8 * b + j] < 0) << np.uint8(j)
        bits[b] = byte
    if full < end_byte:
        byte = np.uint8(0)
        for i in range(8 * full, n):
            byte |= np.uint8(x[i] < 0) << np.uint8(i - 8 * full)
        bits[full] = byte


@njit(nogil=True, cache=True)
def pack_signs(x: np.ndarray, bits: np.ndarray) -> None:
    """Sign bits of all of ``x``. (A fused pack + L1 pass per chunk measured slower, 6 vs
    11 GB/s, than this pass after ``norms.abs_sum``.)"""
    _pack_range(x, bits, 0, bits.shape[0])


TABLE_FROM = 256  # bytes of bits from which writing goes through a table of 256 x 8 values


@njit(nogil=True, cache=True)
def unpack_signs(bits: np.ndarray, scale: np.float32, out: np.ndarray, accumulate: bool) -> None:
    """``out[i] (+)= -scale`` if bit ``i`` is set else ``+scale``. A loop over bytes, each
    giving 8 values, one loop per case: 1.75x (adding) and 2.4x (writing) the loop over
    elements that took bit ``i & 7`` of byte ``i >> 3`` (12.6M elements: 3.2 against 5.5 ms,
    2.0 against 4.7 ms), what a server pays per push and a worker per reply.

    Writing copies each byte's 8 values from a table (a server's first push, a worker's
    pull): 16M elements 8.6-8.9 ms against 12.2-12.6 with the select per value, which
    compiled worse written than added; adding through the table is the slower one (12.3
    against 7.7 ms), so adding keeps the select."""
    n = out.shape[0]
    negative = -scale
    full = n >> 3
    if accumulate:
        for b in range(full):
            byte = bits[b]
            for j in range(8):
                out[8 * b + j] += negative if (byte >> np.uint8(j)) & np.uint8(1) else scale
    elif full >= TABLE_FROM:
        table = np.empty((256, 8), np.float32)
        for v in range(256):
            for j in range(8):
                table[v, j] = negative if (v >> j) & 1 else scale
        for b in range(full):
            row = table[bits[b]]
            for j in range(8):
                out[8 * b + j] = row[j]
    else:
        for b in range(full):
            byte = bits[b]
            for j in range(8):
                out[8 * b + j] = negative if (byte >> np.uint8(j)) & np.uint8(1) else scale
    for i in range(8 * full, n):
        value = negative if (bits[i >> 3] >> np.uint8(i & 7)) & np.uint8(1) else scale
        if accumulate:
            out[i] += value
        else:
            out[i] = value


@njit(inline="always", nogil=True, cache=True)
def _p(g: np.ndarray, e: np.ndarray, lam: float, i: int) -> np.float32:
    """p_i = g_i + lam * e_i as ``elementwise.compensate`` rounds it."""
    if lam == 1.0:
        return g[i] + e[i]
    return np.float32(g[i] + lam * e[i])


@njit(nogil=True, cache=True)
def _feedback_norms(g: np.ndarray, e: np.ndarray, lam: float, square: bool) -> tuple:
    """Pass 1: (sum |p|, sum p^2 if ``square``) of p = g + lam * e, in the order of
    ``kernels.reduction``. Full chunks compute p inside the lane loop (never stored:
    12 GB/s, against 6.7 for p into a chunk scratch and then ``chunk_sum``); the last,
    partial chunk goes through the scratch."""
    n = g.shape[0]
    chunks = (n + CHUNK - 1) // CHUNK
    l1 = np.empty(chunks)
    l2 = np.zeros(chunks)
    lanes = np.empty(LANES)
    squares = np.empty(LANES)
    for c in range(n // CHUNK):
        lanes[:] = 0.0
        squares[:] = 0.0
        for m in range(CHUNK // LANES):
            base = c * CHUNK + m * LANES
            for j in range(LANES):
                v = np.float64(_p(g, e, lam, base + j))
                lanes[j] += abs(v)
                if square:
                    squares[j] += v * v
        l1[c] = lane_tree(lanes)
        if square:
            l2[c] = lane_tree(squares)
    start = (n // CHUNK) * CHUNK
    if start < n:
        block = np.empty(n - start, np.float32)
        compensate(g[start:], e[start:], lam, block)
        l1[chunks - 1] = chunk_sum(block, 0, False, lanes)
        if square:
            l2[chunks - 1] = chunk_sum(block, 0, True, lanes)
    return pairwise_total(l1), pairwise_total(l2)


@njit(nogil=True, cache=True)
def _pack_feedback(g: np.ndarray, e: np.ndarray, lam: float, scale: np.float32,
                   bits: np.ndarray, e_out: np.ndarray) -> None:
    """Pass 2: sign bits of p and e_out = p - D(c) (``e_out`` may be ``e``).

    64 elements at a time: p into a 64-float scratch first, then one fixed-trip loop
    builds the 64-bit word of signs and writes the residuals. The scratch is what keeps
    it vectorised when e_out is e (LLVM's overlap check fails for g/e -> e_out in place
    and it runs scalar: 5.3 GB/s; with the scratch 15 GB/s, before 3.0)."""
    n = g.shape[0]
    negative = -scale
    p = np.empty(LANES, np.float32)
    for w in range(n // 64):
        base = 64 * w
        for j in range(64):
            p[j] = _p(g, e, lam, base + j)
        word = np.uint64(0)
        for j in range(64):
            word |= np.uint64(p[j] < 0) << np.uint64(j)
            e_out[base + j] = p[j] - (negative if p[j] < 0 else scale)
        for b in range(8):  # the little-endian bytes of the word: the shared bit layout
            bits[8 * w + b] = np.uint8((word >> np.uint64(8 * b)) & np.uint64(0xFF))
    start = (n // 64) * 64
    if start < n:
        tail = p[:n - start]
        compensate(g[start:], e[start:], lam, tail)
        _pack_range(tail, bits[start // 8:], 0, (n - start + 7) // 8)
        for i in range(n - start):
            e_out[start + i] = tail[i] - (negative if tail[i] < 0 else scale)


def encode_feedback(g: np.ndarray, e: np.ndarray, lam: float, scaling: str, bits: np.ndarray,
                    e_out: np.ndarray) -> np.float32 | None:
    """Error feedback fused into onebit: p = g + lam * e; ``bits`` = C(p); e_out = p - D(C(p)).
    Returns the scale, or None (nothing written) when p has a NaN or inf: pass 1's L1 sum
    is the check, so ``e_out`` may alias ``e``. Two passes over g and e."""
    l1, l2 = _feedback_norms(g, e, lam, scaling == "l2")
    if not math.isfinite(l1):
        return None
    scale = scale_from_norms(scaling, g.shape[0], l1, l2)
    _pack_feedback(g, e, lam, scale, bits, e_out)
    return scale
