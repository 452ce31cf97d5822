"""CPU kernels of the onebit codec: sign bits (1 = negative) in the shared bit layout."""
import numpy as np
from numba import njit


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
