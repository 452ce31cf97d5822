"""The k-largest-magnitude rule shared by CPU and GPU top-k.

Keys are the float32 bit patterns of ``|x_i|`` (monotone in ``|x_i|``). The threshold
``T`` is the k-th largest key, found by two 16-bit histogram passes; every element with
key > T is kept, and of those with key == T the lowest indices are kept until k are
chosen. Output is in increasing index order. These helpers work on the histograms, which
are small, so the GPU path runs them on the host.
"""
import numpy as np
from numba import njit

HIGH_BINS = 1 << 15  # keys of finite |x| are below 0x7F800000: 15 high bits suffice
LOW_BINS = 1 << 16


@njit(nogil=True, cache=True)
def bin_holding_rank(histogram: np.ndarray, rank: int) -> tuple:
    """Scanning bins from the top, the bin holding the ``rank``-th largest (1-based) key,
    and how many keys lie in higher bins."""
    above = 0
    for b in range(histogram.shape[0] - 1, -1, -1):
        if above + histogram[b] >= rank:
            return b, above
        above += histogram[b]
    return 0, above


@njit(nogil=True, cache=True)
def threshold_from_histograms(high_bin: int, above_high: int, low_histogram: np.ndarray,
                              k: int) -> tuple:
    """Threshold key and how many keys equal to it are kept, given the second pass."""
    low_bin, above_low = bin_holding_rank(low_histogram, k - above_high)
    threshold = (high_bin << 16) | low_bin
    keep_equal = k - above_high - above_low
    return threshold, keep_equal
