"""top-k on the GPU with the rule of ``kernels.selection``, as on the CPU, with no host
round trip before the single copy of the payload (k indices, k values, one status word)
into a pinned host buffer. Everything the host used to decide lives in a small device
``state`` that each kernel reads:

1. a strided sample of ``selection.sample_plan`` sorted in shared memory by one block
   (bitonic: 4096 keys at most) gives the estimate, a little below the k-th largest key;
2. one counting pass per tile, whose last block scans the tile counts, and an
   order-preserving compaction of the candidates (keys >= estimate); it flags NaN/inf;
3. the exact threshold among the candidates by radix select, three 10- or 11-bit digits,
   each a histogram in shared memory per block summed into a global one, whose last block
   picks the digit holding the rank;
4. the k pairs: per-tile counts of keys above and equal to the threshold, scanned by the
   last block, then each thread writes its pairs at its place (ties: the lowest indices).

When the estimate was off (fewer than k candidates, or more than the capacity) step 2 sets
``FALLBACK`` and steps 3 and 4 run over the whole input instead: each kernel reads the
flag itself, over a grid covering the whole input, so the host never waits to learn
which. A scan or a pick is done by the last block to finish (``topk_radix.last_block``);
the state's reset rides in the estimate's block, and the NaN flag holds the call's epoch
(``scratch.epoch``). So a top-k is 9 launches with error feedback (8 without), each about
25 us of the host's time on an H200. The grid's second dimension is the segment: a
tensor's partitions go through the same launches at once (``topk_segments``), each with
its own state, k, histograms, candidates and payload.
"""
import numpy as np
from numba import cuda

from gradpress.kernels.cpu.norms import INF_BITS
from gradpress.kernels.cuda import device, scratch, sparse_buffers
from gradpress.kernels.cuda.device import device_line_padded, line_padded
from gradpress.kernels.cuda.blockscan import exclusive_scan, scan_in_place
from gradpress.kernels.cuda.elementwise import compensate_flagged
from gradpress.kernels.cuda.topk_pairs import count_kept, write_pairs
from gradpress.kernels.cuda.topk_radix import (
    ABS, COUNT, DIGITS, ESTIMATE, FALLBACK, HISTOGRAM, ITEMS, NONFINITE, RANK, STATE, THREADS, TILE,
    digit_histogram, last_block)
from gradpress.kernels.selection import SAMPLE, sample_plan
from gradpress.errors import NonFiniteInput

def tiles(n: int) -> int:
    return max(1, (n + TILE - 1) // TILE)


_plan = cuda.jit(device=True)(sample_plan.py_func)  # the one rule, as the CPU draws it


@cuda.jit(cache=True)
def _estimate(whole_bits, seg_len, k_all, k_last, whole_state, whole_histogram):
    """One block per segment (``segment``): the call's state (RANK = k, the rest 0 but the
    NaN flag, which holds an epoch: ``_count_candidates``) and histogram reset; then sort
    the sample of ``selection.sample_plan`` (padded with zero keys, which sort below every
    real key) in shared memory: the rank-th largest is the estimate. The reset rides here
    rather than in a launch of its own."""
    s = cuda.blockIdx.y
    bits = whole_bits[s * seg_len:min(s * seg_len + seg_len, whole_bits.shape[0])]
    state = whole_state[s * STATE:s * STATE + STATE]
    histogram = whole_histogram[s * HISTOGRAM:s * HISTOGRAM + HISTOGRAM]
    k = k_last if s == cuda.gridDim.y - 1 else k_all
    n = bits.shape[0]
    m, rank, _ = _plan(n, k)
    padded = 1
    while padded < m:
        padded *= 2
    t = cuda.threadIdx.x
    for i in range(t, histogram.shape[0], THREADS):
        histogram[i] = 0
    if t < STATE and t != NONFINITE:
        state[t] = k if t == RANK else 0
    sample = cuda.shared.array(SAMPLE, np.uint32)
    for j in range(t, padded, THREADS):
        sample[j] = bits[(j * n) // m] & ABS if j < m else 0
    cuda.syncthreads()
    size = 2
    while size <= padded:
        stride = size // 2
        while stride > 0:
            for j in range(t, padded // 2, THREADS):
                low = 2 * j - (j & (stride - 1))
                high = low + stride
                a, b = sample[low], sample[high]
                if (a > b) == ((low & size) == 0):
                    sample[low], sample[high] = b, a
            cuda.syncthreads()
            stride //= 2
        size *= 2
    if t == 0:
        state[ESTIMATE] = sample[padded - rank]


@cuda.jit(cache=True)
def _count_candidates(whole_bits, seg_len, k_all, k_last, whole_state, whole_counts, epoch):
    """Per tile: how many keys reach the estimate; any NaN/inf is flagged (state[NONFINITE]
    = ``epoch``, this call's number: an earlier call's flag is another). The last block
    then scans the tile counts in place (each tile's offset), and sets COUNT and FALLBACK."""
    s = cuda.blockIdx.y
    bits = whole_bits[s * seg_len:min(s * seg_len + seg_len, whole_bits.shape[0])]
    state = whole_state[s * STATE:s * STATE + STATE]
    stride = device_line_padded(cuda.gridDim.x)  # each segment's counts on lines of their own
    counts = whole_counts[s * stride:s * stride + cuda.gridDim.x]
    k = k_last if s == cuda.gridDim.y - 1 else k_all
    _, _, capacity = _plan(bits.shape[0], k)
    scan = cuda.shared.array(THREADS, np.int64)
    flag = cuda.shared.array(1, np.int32)
    t = cuda.threadIdx.x
    estimate = state[ESTIMATE]
    first = cuda.blockIdx.x * TILE + t * ITEMS
    own = np.int64(0)
    for i in range(first, min(first + ITEMS, bits.shape[0])):
        key = np.int64(bits[i] & ABS)
        own += key >= estimate
        if key >= INF_BITS:
            state[NONFINITE] = epoch
    _, total = exclusive_scan(scan, t, own)
    if t == 0:
        counts[cuda.blockIdx.x] = total
    if last_block(state, t, flag):
        total = scan_in_place(counts, counts.shape[0], scan, t)
        if t == 0:
            state[COUNT] = total
            state[FALLBACK] = 0 if k <= total <= capacity else 1


@cuda.jit(cache=True)
def _compact(whole_bits, seg_len, whole_state, whole_offsets, whole_index, whole_found):
    """The candidates, in index order, at the places the scan gave their tile."""
    s = cuda.blockIdx.y
    state = whole_state[s * STATE:s * STATE + STATE]
    if state[FALLBACK]:
        return  # the whole block: no barrier is left waiting
    bits = whole_bits[s * seg_len:min(s * seg_len + seg_len, whole_bits.shape[0])]
    stride = device_line_padded(cuda.gridDim.x)
    offsets = whole_offsets[s * stride:s * stride + cuda.gridDim.x]
    capacity = whole_index.shape[0] // cuda.gridDim.y
    candidate_index = whole_index[s * capacity:(s + 1) * capacity]
    candidate_bits = whole_found[s * capacity:(s + 1) * capacity]
    scan = cuda.shared.array(THREADS, np.int64)
    t = cuda.threadIdx.x
    estimate = state[ESTIMATE]
    first = cuda.blockIdx.x * TILE + t * ITEMS
    last = min(first + ITEMS, bits.shape[0])
    own = np.int64(0)
    for i in range(first, last):
        own += np.int64(bits[i] & ABS) >= estimate
    before, _ = exclusive_scan(scan, t, own)
    out = offsets[cuda.blockIdx.x] + before
    for i in range(first, last):
        if np.int64(bits[i] & ABS) >= estimate:
            candidate_index[out] = i
            candidate_bits[out] = bits[i]
            out += 1


def _select(p, k: int, state, zero: bool, epoch, segments: tuple | None = None):
    """Launch steps 1-4 over ``p`` (float32) and return the device payload words (indices,
    value bits, NaN flag: ``epoch`` where p had a NaN/inf). With ``segments`` (seg_len,
    k_last, scratch_of), over each segment of seg_len elements at once (a tensor's
    partitions), keeping k of each but the last, k_last of that, the grid's second
    dimension the segment, the scratch from ``scratch_of(role, count, dtype)``."""
    stream = device.stream()
    n = p.shape[0]
    if segments is None:  # one: 1-D grids (the launch's own Python costs per dimension)
        seg_len, k_last, scratch_of, count = max(n, 1), k, sparse_buffers.scratch, 1
        capacity, grid, one_block = sample_plan(n, k)[2], tiles(n), 1
    else:
        (seg_len, k_last, scratch_of), count = segments, -(-n // segments[0])
        capacity = max(sample_plan(seg_len, k)[2], sample_plan(n - (count - 1) * seg_len, k_last)[2])
        grid, one_block = (tiles(seg_len), count), (1, count)
    # a segment's tile counts start on a cache line of their own (``device.line_padded``)
    tile_count = line_padded(tiles(min(seg_len, n))) * count
    bits = p.view(np.uint32)
    histogram = scratch_of("topk-histogram", count * HISTOGRAM, np.int32)
    _estimate[one_block, THREADS, stream](bits, seg_len, k, k_last, state, histogram)
    counts = scratch_of("topk-counts", tile_count, np.int64)
    _count_candidates[grid, THREADS, stream](bits, seg_len, k, k_last, state, counts, epoch)
    index = scratch_of("topk-index", count * capacity, np.uint32)
    found = scratch_of("topk-bits", count * capacity, np.uint32)
    _compact[grid, THREADS, stream](bits, seg_len, state, counts, index, found)
    payload = scratch_of("topk-payload", (count - 1) * (2 * k + 1) + 2 * k_last + 1, np.uint32)
    # steps 3 and 4 over the candidates, or over the whole input where the scan set
    # FALLBACK: each kernel reads which, so one launch each serves both (the grid covers
    # the whole input; tiles past the candidates return at once)
    for digit, (shift, width) in enumerate(DIGITS):
        digit_histogram[grid, THREADS, stream](found, bits, seg_len, state, histogram, digit, shift, width)
    above = scratch_of("topk-above", tile_count, np.int64)
    equal = scratch_of("topk-equal", tile_count, np.int64)
    count_kept[grid, THREADS, stream](found, bits, seg_len, state, above, equal)
    write_pairs[grid, THREADS, stream](found, index, bits, seg_len, state, above, equal, k, k_last, payload, zero, p)
    return payload


def _start() -> tuple:
    """The call's state (zeroed when made, so that no epoch is found in its NaN flag by
    chance; ``_estimate`` resets the rest) and epoch."""
    return scratch.zeroed((STATE,), np.int64, "topk-state"), scratch.epoch()


def _land(payload, k: int, reuse, epoch) -> tuple | None:
    """The one copy to the host, and the wait for it; None when the input had a NaN/inf."""
    host = sparse_buffers.payload(2 * k + 1, reuse)
    payload.copy_to_host(host, stream=device.stream())
    device.stream().synchronize()
    if host[2 * k] == epoch:
        return None
    return host[:k], host[k:2 * k].view(np.float32)


def select_topk(x, k: int) -> tuple:
    """Host (indices uint32, values float32) of the k (1 <= k <= n) largest magnitudes of
    device ``x``: views of one pinned buffer, returned to a pool once both are gone."""
    state, epoch = _start()
    selected = _land(_select(x, k, state, False, epoch), k, None, epoch)
    if selected is None:
        raise NonFiniteInput("topk input contains NaN or inf")
    return selected


def select_topk_feedback(g, e, lam: float, e_out, k: int, reuse=None) -> tuple | None:
    """Error feedback fused into top-k: e_out = p = g + lam * e in one checked pass, the
    pairs of top-k(p), and the chosen entries of e_out zeroed (exactly p - D(c)). The
    pairs land in ``reuse`` (the key's previous payload) where it is one of ours.
    None when p is not finite (e_out then holds garbage; it must not be e)."""
    state, epoch = _start()
    compensate_flagged(g, e, lam, e_out, state[NONFINITE:NONFINITE + 1], epoch)
    return _land(_select(e_out, k, state, True, epoch), k, reuse, epoch)
