"""top-k on the GPU with the rule of ``kernels.selection``: two histogram passes (global
atomics), then a compaction in index order: each thread owns a segment of ``SEGMENT``
elements, counts what it keeps, and after a host-side prefix sum writes its pairs."""
import numpy as np
from numba import cuda

from gradpress.kernels.cpu.norms import INF_BITS
from gradpress.kernels.cuda import norms
from gradpress.kernels.cuda.device import THREADS, blocks
from gradpress.kernels.selection import HIGH_BINS, LOW_BINS, bin_holding_rank, threshold_from_histograms

SEGMENT = 256
_ABS = np.uint32(0x7FFFFFFF)


@cuda.jit
def _histogram(keys, high_bin, histogram):
    """high_bin < 0: histogram of the high 16 bits; else of the low 16 bits within it."""
    i = cuda.grid(1)
    if i < keys.shape[0]:
        key = keys[i] & _ABS
        if high_bin < 0:
            cuda.atomic.add(histogram, key >> 16, 1)
        elif key >> 16 == high_bin:
            cuda.atomic.add(histogram, key & 0xFFFF, 1)


@cuda.jit
def _segment_counts(keys, threshold, above, equal):
    s = cuda.grid(1)
    if s >= above.shape[0]:
        return
    n_above, n_equal = 0, 0
    for i in range(s * SEGMENT, min((s + 1) * SEGMENT, keys.shape[0])):
        key = keys[i] & _ABS
        n_above += key > threshold
        n_equal += key == threshold
    above[s] = n_above
    equal[s] = n_equal


@cuda.jit
def _compact(x, keys, threshold, offsets, equal_take, indices, values):
    s = cuda.grid(1)
    if s >= offsets.shape[0]:
        return
    out = offsets[s]
    take = equal_take[s]
    for i in range(s * SEGMENT, min((s + 1) * SEGMENT, keys.shape[0])):
        key = keys[i] & _ABS
        if key > threshold or (key == threshold and take > 0):
            if key == threshold:
                take -= 1
            indices[out] = i
            values[out] = x[i]
            out += 1


def _threshold(keys, k: int) -> tuple:
    high = cuda.to_device(np.zeros(HIGH_BINS, np.int64))
    _histogram[blocks(keys.shape[0]), THREADS](keys, -1, high)
    high_bin, above_high = bin_holding_rank(high.copy_to_host(), k)
    low = cuda.to_device(np.zeros(LOW_BINS, np.int64))
    _histogram[blocks(keys.shape[0]), THREADS](keys, high_bin, low)
    return threshold_from_histograms(high_bin, above_high, low.copy_to_host(), k)


def select_topk(x, k: int) -> tuple:
    """Host (indices uint32, values float32) of the k largest magnitudes of device ``x``."""
    if norms.max_abs_bits(x) >= INF_BITS:
        raise ValueError("topk input contains NaN or inf")
    keys = x.view(np.uint32)
    threshold, keep_equal = _threshold(keys, k)
    segments = (x.shape[0] + SEGMENT - 1) // SEGMENT
    above = cuda.device_array(segments, np.int64)
    equal = cuda.device_array(segments, np.int64)
    _segment_counts[blocks(segments), THREADS](keys, np.uint32(threshold), above, equal)
    above, equal = above.copy_to_host(), equal.copy_to_host()
    equal_before = np.concatenate([[0], np.cumsum(equal)[:-1]])
    equal_take = np.clip(keep_equal - equal_before, 0, equal)
    kept = above + equal_take
    offsets = np.concatenate([[0], np.cumsum(kept)[:-1]])
    indices = cuda.device_array(k, np.uint32)
    values = cuda.device_array(k, np.float32)
    _compact[blocks(segments), THREADS](x, keys, np.uint32(threshold), cuda.to_device(offsets),
                                        cuda.to_device(equal_take), indices, values)
    return indices.copy_to_host(), values.copy_to_host()
