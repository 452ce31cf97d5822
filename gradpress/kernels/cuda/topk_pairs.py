"""Step 4 of the GPU top-k (``topk``): the k pairs, once the threshold is known. Per tile
of the source (the candidates, or the whole input where the estimate was off), the keys
above the threshold and equal to it are counted and scanned; then each thread writes its
pairs at its place, the equal keys kept lowest index first (the CPU's tie rule). The grid's
second dimension is the segment (a tensor's partition), each with its own state."""
import numpy as np
from numba import cuda

from gradpress.kernels.cuda.blockscan import exclusive_scan, scan_in_place
from gradpress.kernels.cuda.device import device_line_padded
from gradpress.kernels.cuda.topk_radix import (
    ABS, FALLBACK, ITEMS, NONFINITE, PREFIX, RANK, STATE, THREADS, TILE, last_block, source_length, source_word)


@cuda.jit(cache=True)
def count_kept(whole_found, whole_bits, seg_len, whole_state, whole_above, whole_equal):
    """Per tile of the source: keys above the threshold, and equal to it (tiles past the
    source only draw their ticket); the last block then scans the source's tile counts in
    place."""
    s = cuda.blockIdx.y
    bits = whole_bits[s * seg_len:min(s * seg_len + seg_len, whole_bits.shape[0])]
    state = whole_state[s * STATE:s * STATE + STATE]
    capacity = whole_found.shape[0] // cuda.gridDim.y
    found = whole_found[s * capacity:(s + 1) * capacity]
    stride = device_line_padded(cuda.gridDim.x)  # each segment's counts on lines of their own
    above = whole_above[s * stride:s * stride + cuda.gridDim.x]
    equal = whole_equal[s * stride:s * stride + cuda.gridDim.x]
    direct = state[FALLBACK]
    length = source_length(bits, direct, state)
    first = cuda.blockIdx.x * TILE
    scan = cuda.shared.array(THREADS, np.int64)
    flag = cuda.shared.array(1, np.int32)
    t = cuda.threadIdx.x
    if first < length:  # the whole block either way: its barriers are met
        threshold = state[PREFIX]
        first += t * ITEMS
        own_above, own_equal = np.int64(0), np.int64(0)
        for i in range(first, min(first + ITEMS, length)):
            key = np.int64(source_word(found, bits, direct, i) & ABS)
            own_above += key > threshold
            own_equal += key == threshold
        _, total_above = exclusive_scan(scan, t, own_above)
        _, total_equal = exclusive_scan(scan, t, own_equal)
        if t == 0:
            above[cuda.blockIdx.x] = total_above
            equal[cuda.blockIdx.x] = total_equal
    if last_block(state, t, flag):
        tile_count = (length + TILE - 1) // TILE
        scan_in_place(above, tile_count, scan, t)
        scan_in_place(equal, tile_count, scan, t)


@cuda.jit(cache=True)
def write_pairs(whole_found, whole_index, whole_bits, seg_len, whole_state, whole_above, whole_equal, k_all,
                 k_last, whole_payload, zero, whole_target):
    """Each thread's pairs at its place: the keys above the threshold before it, plus the
    equal ones before it that the tie rule keeps (the first ``RANK``). With ``zero``,
    ``target`` (p) gets 0 where a pair was taken. A segment's payload (its k indices, k
    values and its NaN flag) starts at word s * (2 * k_all + 1)."""
    s = cuda.blockIdx.y
    k = k_last if s == cuda.gridDim.y - 1 else k_all
    state = whole_state[s * STATE:s * STATE + STATE]
    payload = whole_payload[s * (2 * k_all + 1):s * (2 * k_all + 1) + 2 * k + 1]
    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
        payload[2 * k] = state[NONFINITE]
    lo = s * seg_len
    hi = min(lo + seg_len, whole_bits.shape[0])
    bits = whole_bits[lo:hi]
    target = whole_target[lo:hi]
    capacity = whole_found.shape[0] // cuda.gridDim.y
    found = whole_found[s * capacity:(s + 1) * capacity]
    index = whole_index[s * capacity:(s + 1) * capacity]
    direct = state[FALLBACK]
    length = source_length(bits, direct, state)
    first = cuda.blockIdx.x * TILE
    if first >= length:
        return  # the whole block
    scan = cuda.shared.array(THREADS, np.int64)
    t = cuda.threadIdx.x
    threshold, keep_equal = state[PREFIX], state[RANK]
    first += t * ITEMS
    last = min(first + ITEMS, length)
    own_above, own_equal = np.int64(0), np.int64(0)
    for i in range(first, last):
        key = np.int64(source_word(found, bits, direct, i) & ABS)
        own_above += key > threshold
        own_equal += key == threshold
    above_before, _ = exclusive_scan(scan, t, own_above)
    equal_before, _ = exclusive_scan(scan, t, own_equal)
    stride = device_line_padded(cuda.gridDim.x)
    above_before += whole_above[s * stride + cuda.blockIdx.x]
    equal_before += whole_equal[s * stride + cuda.blockIdx.x]
    out = above_before + min(equal_before, keep_equal)
    for i in range(first, last):
        word = source_word(found, bits, direct, i)
        key = np.int64(word & ABS)
        keep = key > threshold
        if key == threshold:
            keep = equal_before < keep_equal
            equal_before += 1
        if keep and out < k:
            at = i if direct else np.int64(index[i])
            payload[out] = at
            payload[k + out] = word
            if zero:
                target[at] = 0.0
            out += 1
