"""The k-largest-magnitude rule shared by CPU and GPU top-k.

Keys are the float32 bit patterns of ``|x_i|`` (monotone in ``|x_i|``). The threshold
``T`` is the k-th largest key, found by two 16-bit histogram passes; every element with
key > T is kept, and of those with key == T the lowest indices are kept until k are
chosen. Output is in increasing index order. These helpers work on the histograms (the
CPU's); the GPU path finds the same threshold on the device, by three smaller digits
(``cuda/topk.py``).

Finding T needs passes over the whole input; ``sample_plan`` lets both paths skip them: a
strided sample of ``SAMPLE`` keys gives an estimate a little below T, one pass collects
the candidates above it, and T is found among those (see ``cpu/topk.py``).
"""
import numpy as np
from numba import njit

HIGH_BINS = 1 << 15  # keys of finite |x| are below 0x7F800000: 15 high bits suffice
LOW_BINS = 1 << 16
SAMPLE = 4096  # keys sampled (elements j * n // SAMPLE) to estimate the threshold


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


@njit(nogil=True, cache=True)
def sample_plan(n: int, k: int) -> tuple:
    """(sample size m, rank r, candidate capacity) for top-k of ``n`` (k >= 1): the r-th
    largest sampled key is the estimate; r aims at 1.25k candidates (plus 8 against
    sampling noise), the capacity at twice the expected count. With m = n the estimate
    is at most the true threshold, so it always holds unless ties overflow the capacity."""
    m = min(n, SAMPLE)
    rank = min(m, (5 * m * k + 4 * n - 1) // (4 * n) + 8)
    expected = (n * rank + m - 1) // m
    return m, rank, min(n, 2 * expected + 64)
