"""CPU kernels of random-k: the index set (also used by the GPU path, on the host) and the
gather of scaled values, and error feedback fused into them (``gather_feedback``).

Index choice is Floyd's algorithm driven by the counter hash: for step ``t = 0..k-1``,
``j = n - k + t`` and ``r = below(draw_bits(stream, t), j + 1)``; ``r`` joins the set unless
already in it, then ``j`` does. A bitmap keeps membership, and reading the bitmap in order
yields the indices sorted. O(k) draws, O(n/64) words to clear and scan.
"""
import numpy as np
from numba import njit

from gradpress.kernels.cpu.elementwise import compensate_checked
from gradpress.kernels.rng import below, draw_bits

_WORD = np.uint64(1)


@njit(nogil=True, cache=True)
def random_indices(n: int, k: int, stream: np.uint64) -> np.ndarray:
    """k distinct indices in ``[0, n)``, increasing, determined by ``stream`` (n < 2**32)."""
    bitmap = np.zeros((n + 63) // 64, np.uint64)
    for step in range(k):
        j = n - k + step
        r = np.int64(below(draw_bits(stream, np.uint64(step)), np.uint64(j + 1)))
        if bitmap[r >> 6] & (_WORD << np.uint64(r & 63)):
            r = j
        bitmap[r >> 6] |= _WORD << np.uint64(r & 63)
    indices = np.empty(k, np.uint32)
    out = 0
    for w in range(bitmap.shape[0]):
        word = bitmap[w]
        while word:
            low = word & (~word + _WORD)  # lowest set bit
            indices[out] = w * 64 + bit_position(low)
            out += 1
            word ^= low
    return indices


# de Bruijn sequence: (single_bit * _DE_BRUIJN) >> 58 is unique for each of the 64 bits
_DE_BRUIJN = np.uint64(0x03F79D71B4CB0A89)
_BIT_OF_SLOT = np.zeros(64, np.int64)
for _bit in range(64):
    _BIT_OF_SLOT[(((1 << _bit) * int(_DE_BRUIJN)) & ((1 << 64) - 1)) >> 58] = _bit


@njit(inline="always", nogil=True, cache=True)
def bit_position(single_bit: np.uint64) -> int:
    """Position (0..63) of the one set bit of ``single_bit``."""
    return _BIT_OF_SLOT[(single_bit * _DE_BRUIJN) >> np.uint64(58)]


@njit(nogil=True, cache=True)
def gather_scaled(x: np.ndarray, indices: np.ndarray, scale: float, values: np.ndarray) -> None:
    """``values[j] = float32(float64(x[indices[j]]) * scale)``."""
    for j in range(indices.shape[0]):
        values[j] = np.float32(np.float64(x[indices[j]]) * scale)


@njit(nogil=True, cache=True)
def _take_feedback(e_out: np.ndarray, indices: np.ndarray, scale: float,
                   values: np.ndarray) -> bool:
    """values = p[indices] scaled; e_out[indices] = p - values; whether all are finite."""
    finite = True
    for j in range(indices.shape[0]):
        i = indices[j]
        value = np.float32(np.float64(e_out[i]) * scale)
        values[j] = value
        e_out[i] = e_out[i] - value
        finite &= abs(value) < np.inf and abs(e_out[i]) < np.inf
    return finite


@njit(nogil=True, cache=True)
def gather_feedback(g: np.ndarray, e: np.ndarray, lam: float, e_out: np.ndarray,
                    indices: np.ndarray, scale: float, values: np.ndarray) -> bool:
    """Error feedback fused into random-k: e_out = p = g + lam * e in one pass, then the
    chosen entries are read out (``gather_scaled``'s rounding) and become p - value.
    False when anything is not finite; ``e_out`` then holds garbage and must not alias
    ``e``. ``lam = 0`` with ``e = g`` gives p = g bit for bit."""
    if not compensate_checked(g, e, lam, e_out):
        return False
    return _take_feedback(e_out, indices, scale, values)
