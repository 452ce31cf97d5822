"""CPU kernels of the onebit codec: sign bits (1 = negative) in the shared bit layout,
and the codec with error feedback fused in (``encode_feedback``)."""
import math

import numpy as np
from numba import njit

from gradpress.kernels.cpu.elementwise import compensate
from gradpress.kernels.cpu.norms import chunk_sum
from gradpress.kernels.reduction import CHUNK, LANES, pairwise_total
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


@njit(nogil=True, cache=True)
def unpack_signs(bits: np.ndarray, scale: np.float32, out: np.ndarray, accumulate: bool) -> None:
    """``out[i] (+)= -scale`` if bit ``i`` is set else ``+scale``."""
    n = out.shape[0]
    negative = -scale
    for i in range(n):
        value = negative if (bits[i >> 3] >> np.uint8(i & 7)) & np.uint8(1) else scale
        if accumulate:
            out[i] += value
        else:
            out[i] = value


@njit(nogil=True, cache=True)
def _feedback_norms(g: np.ndarray, e: np.ndarray, lam: float, square: bool) -> tuple:
    """Pass 1: (sum |p|, sum p^2 if ``square``) of p = g + lam * e, in the order of
    ``kernels.reduction``; p lives only in a one-chunk scratch that stays in cache."""
    n = g.shape[0]
    chunks = (n + CHUNK - 1) // CHUNK
    l1 = np.empty(chunks)
    l2 = np.zeros(chunks)
    p = np.empty(CHUNK, np.float32)
    lanes = np.empty(LANES)
    for c in range(chunks):
        start, end = c * CHUNK, min((c + 1) * CHUNK, n)
        block = p[:end - start]
        compensate(g[start:end], e[start:end], lam, block)
        l1[c] = chunk_sum(block, 0, False, lanes)
        if square:
            l2[c] = chunk_sum(block, 0, True, lanes)
    return pairwise_total(l1), pairwise_total(l2)


@njit(nogil=True, cache=True)
def _pack_feedback(g: np.ndarray, e: np.ndarray, lam: float, scale: np.float32,
                   bits: np.ndarray, e_out: np.ndarray) -> None:
    """Pass 2: sign bits of p and e_out = p - D(c) (``e_out`` may be ``e``: each chunk of
    p is computed before its residual overwrites e)."""
    n = g.shape[0]
    p = np.empty(CHUNK, np.float32)
    negative = -scale
    for start in range(0, n, CHUNK):
        end = min(start + CHUNK, n)
        block = p[:end - start]
        compensate(g[start:end], e[start:end], lam, block)
        _pack_range(block, bits[start // 8:], 0, (end - start + 7) // 8)
        for i in range(end - start):
            e_out[start + i] = block[i] - (negative if block[i] < 0 else scale)


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
