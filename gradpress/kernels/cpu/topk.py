"""CPU kernels of top-k: threshold by histograms (see ``kernels.selection``), then gather."""
import numpy as np
from numba import njit

from gradpress.kernels.selection import HIGH_BINS, LOW_BINS, bin_holding_rank, threshold_from_histograms

_ABS = np.uint32(0x7FFFFFFF)


@njit(nogil=True, cache=True)
def _threshold(keys: np.ndarray, k: int) -> tuple:
    high = np.zeros(HIGH_BINS, np.int64)
    for i in range(keys.shape[0]):
        high[(keys[i] & _ABS) >> 16] += 1
    high_bin, above_high = bin_holding_rank(high, k)
    low = np.zeros(LOW_BINS, np.int64)
    for i in range(keys.shape[0]):
        key = keys[i] & _ABS
        if key >> 16 == high_bin:
            low[key & 0xFFFF] += 1
    return threshold_from_histograms(high_bin, above_high, low, k)


@njit(nogil=True, cache=True)
def select_topk(x: np.ndarray, indices: np.ndarray, values: np.ndarray) -> None:
    """Fill ``indices``/``values`` (length k >= 1) with the k largest-magnitude entries.
    ``x`` must be finite (the caller checks)."""
    keys = x.view(np.uint32)
    threshold, keep_equal = _threshold(keys, indices.shape[0])
    out = 0
    for i in range(keys.shape[0]):
        key = keys[i] & _ABS
        if key > threshold or (key == threshold and keep_equal > 0):
            if key == threshold:
                keep_equal -= 1
            indices[out] = i
            values[out] = x[i]
            out += 1
