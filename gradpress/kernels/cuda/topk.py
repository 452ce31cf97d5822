"""top-k on the GPU with the rule of ``kernels.selection``, as on the CPU: a threshold
estimated from a strided sample, one counting pass and one compaction of the candidates
(each thread owns a segment of ``SEGMENT`` elements; a host-side prefix sum gives each its
place), then the exact choice among the candidates on the host (they are few: about
1.25k). When the estimate is off, the full selection: two histogram passes (global
atomics), then the same kind of compaction of the k pairs."""
import numpy as np
from numba import cuda

from gradpress.kernels.cpu.norms import INF_BITS
from gradpress.kernels.cuda import norms
from gradpress.kernels.cpu.topk import choose_among
from gradpress.kernels.cuda.device import THREADS, blocks
from gradpress.kernels.cuda.elementwise import compensate_checked
from gradpress.kernels.selection import (
    HIGH_BINS, LOW_BINS, bin_holding_rank, sample_plan, threshold_from_histograms)

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


def _full_selection(x, k: int) -> tuple:
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


@cuda.jit
def _sample(x, m, sample):
    j = cuda.grid(1)
    if j < m:
        sample[j] = x[(j * x.shape[0]) // m]


@cuda.jit
def _candidate_counts(keys, estimate, counts):
    s = cuda.grid(1)
    if s >= counts.shape[0]:
        return
    count = 0
    for i in range(s * SEGMENT, min((s + 1) * SEGMENT, keys.shape[0])):
        count += (keys[i] & _ABS) >= estimate
    counts[s] = count


@cuda.jit
def _compact_candidates(x, keys, estimate, offsets, indices, values):
    s = cuda.grid(1)
    if s >= offsets.shape[0]:
        return
    out = offsets[s]
    for i in range(s * SEGMENT, min((s + 1) * SEGMENT, keys.shape[0])):
        if (keys[i] & _ABS) >= estimate:
            indices[out] = i
            values[out] = x[i]
            out += 1


@cuda.jit
def _zero_at(x, indices):
    j = cuda.grid(1)
    if j < indices.shape[0]:
        x[indices[j]] = 0.0


def _by_estimate(x, k: int) -> tuple | None:
    """The k pairs through the sampled estimate; None when it was off."""
    n = x.shape[0]
    m, rank, capacity = sample_plan(n, k)
    sample = cuda.device_array(m, np.float32)
    _sample[blocks(m), THREADS](x, m, sample)
    sample_keys = np.sort(sample.copy_to_host().view(np.uint32) & _ABS)
    estimate = np.uint32(sample_keys[m - rank])
    keys = x.view(np.uint32)
    segments = (n + SEGMENT - 1) // SEGMENT
    counts = cuda.device_array(segments, np.int64)
    _candidate_counts[blocks(segments), THREADS](keys, estimate, counts)
    counts = counts.copy_to_host()
    total = int(counts.sum())
    if not k <= total <= capacity:
        return None
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    indices = cuda.device_array(total, np.uint32)
    values = cuda.device_array(total, np.float32)
    _compact_candidates[blocks(segments), THREADS](x, keys, estimate, cuda.to_device(offsets),
                                                   indices, values)
    chosen_indices = np.empty(k, np.uint32)
    chosen_values = np.empty(k, np.float32)
    choose_among(indices.copy_to_host(), values.copy_to_host(), chosen_indices, chosen_values)
    return chosen_indices, chosen_values


def select_topk(x, k: int) -> tuple:
    """Host (indices uint32, values float32) of the k largest magnitudes of device ``x``."""
    if norms.max_abs_bits(x) >= INF_BITS:
        raise ValueError("topk input contains NaN or inf")
    return _by_estimate(x, k) or _full_selection(x, k)


def select_topk_feedback(g, e, lam: float, e_out, k: int) -> tuple | None:
    """Error feedback fused into top-k: e_out = p = g + lam * e in one checked pass, the
    pairs of top-k(p), and the chosen entries of e_out zeroed (exactly p - D(c)).
    None when p is not finite (e_out then holds garbage; it must not be e)."""
    if not compensate_checked(g, e, lam, e_out):
        return None
    indices, values = _by_estimate(e_out, k) or _full_selection(e_out, k)
    _zero_at[blocks(k), THREADS](e_out, cuda.to_device(indices))
    return indices, values
