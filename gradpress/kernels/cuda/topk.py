"""top-k on the GPU with the rule of ``kernels.selection``, as on the CPU, with no host
round trip before the single copy of the payload (k indices, k values, one status word)
into a pinned host buffer. Everything the host used to decide lives in a small device
``state`` that each kernel reads:

1. a strided sample of ``selection.sample_plan`` sorted in shared memory by one block
   (bitonic: 4096 keys at most) gives the estimate, a little below the k-th largest key;
2. one counting pass per tile, whose last block scans the tile counts, and an
   order-preserving compaction of the candidates (keys >= estimate) with their indices;
   the same pass flags NaN/inf;
3. the exact threshold among the candidates by radix select, three 10- or 11-bit digits,
   each a histogram in shared memory per block summed into a global one, whose last block
   picks the digit holding the rank;
4. the k pairs: per-tile counts of keys above and equal to the threshold, scanned by the
   last block, then each thread writes its pairs at its place (ties: the lowest indices,
   as the CPU).

When the estimate was off (fewer than k candidates, or more than the capacity) the scan
of step 2 sets ``FALLBACK`` and steps 3 and 4 run over the whole input instead. Each of
their kernels reads the flag and takes its source (the candidates or the input) itself,
over a grid that covers the whole input, tiles past the source doing nothing: the host
never waits to learn which. What needs every block's part (a scan, a pick) is done by the
last block to finish (``topk_radix.last_block``), not by a one-block kernel of its own.
The reset of the call's state rides in the estimate's block, and the NaN flag holds the
call's epoch (``scratch.epoch``), so nothing needs clearing first. So a top-k is 9
launches with error feedback (8 without); it was 24, launching both variants (one of
which returned at once), the one-block kernels and the reset apart. Each launch is
about 25 us of the host's time on an H200; an idle tile a few nanoseconds of the card's.
"""
import numpy as np
from numba import cuda

from gradpress.kernels.cpu.norms import INF_BITS
from gradpress.kernels.cuda import device, scratch, sparse_buffers
from gradpress.kernels.cuda.blockscan import exclusive_scan, scan_in_place
from gradpress.kernels.cuda.elementwise import compensate_flagged
from gradpress.kernels.cuda.topk_radix import (
    ABS, BINS, COUNT, DIGITS, ESTIMATE, FALLBACK, ITEMS, NONFINITE, PREFIX, RANK, STATE, THREADS, TILE,
    digit_histogram, last_block, source_length, source_word)
from gradpress.kernels.selection import SAMPLE, sample_plan



def tiles(n: int) -> int:
    return max(1, (n + TILE - 1) // TILE)


@cuda.jit
def _estimate(bits, m, padded, rank, state, histogram, k):
    """One block: the call's state (RANK = k, the rest 0 but the NaN flag, which holds
    an epoch: ``_count_candidates``) and histogram reset; then sort the sample (padded with
    zero keys, which sort below every real key) in shared memory: the rank-th largest is
    the estimate. The reset rides here rather than in a launch of its own."""
    t = cuda.threadIdx.x
    for i in range(t, histogram.shape[0], THREADS):
        histogram[i] = 0
    if t < STATE and t != NONFINITE:
        state[t] = k if t == RANK else 0
    sample = cuda.shared.array(SAMPLE, np.uint32)
    n = bits.shape[0]
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


@cuda.jit
def _count_candidates(bits, state, counts, k, capacity, epoch):
    """Per tile: how many keys reach the estimate; any NaN/inf is flagged (state[NONFINITE]
    = ``epoch``, this call's number: an earlier call's flag is another). The last block
    then scans the tile counts in place (each tile's offset), and sets COUNT and FALLBACK."""
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


@cuda.jit
def _compact(bits, state, offsets, candidate_index, candidate_bits):
    """The candidates, in index order, at the places the scan gave their tile."""
    if state[FALLBACK]:
        return  # the whole block: no barrier is left waiting
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


@cuda.jit
def _count_kept(found, bits, state, above, equal):
    """Per tile of the source: keys above the threshold, and equal to it (tiles past the
    source only draw their ticket); the last block then scans the source's tile counts in
    place."""
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


@cuda.jit
def _write_pairs(found, index, bits, state, above, equal, k, payload, zero, target):
    """Each thread's pairs at its place: the keys above the threshold before it, plus the
    equal ones before it that the tie rule keeps (the first ``RANK``). With ``zero``,
    ``target`` (p) gets 0 where a pair was taken."""
    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
        payload[2 * k] = state[NONFINITE]
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
    above_before += above[cuda.blockIdx.x]
    equal_before += equal[cuda.blockIdx.x]
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


def _select(p, k: int, state, zero: bool, epoch) -> np.ndarray:
    """Launch steps 1-4 over ``p`` (float32) and copy the payload out; returns the pinned
    host words (indices, value bits, NaN flag: ``epoch`` where p had a NaN/inf)."""
    stream = device.stream()
    n = p.shape[0]
    bits = p.view(np.uint32)
    m, rank, capacity = sample_plan(n, k)
    histogram = sparse_buffers.scratch("topk-histogram", len(DIGITS) * BINS, np.int32)
    _estimate[1, THREADS, stream](bits, m, 1 << (m - 1).bit_length(), rank, state, histogram, k)
    grid = tiles(n)
    counts = sparse_buffers.scratch("topk-counts", grid, np.int64)
    _count_candidates[grid, THREADS, stream](bits, state, counts, k, capacity, epoch)
    index = sparse_buffers.scratch("topk-index", capacity, np.uint32)
    found = sparse_buffers.scratch("topk-bits", capacity, np.uint32)
    _compact[grid, THREADS, stream](bits, state, counts, index, found)
    payload = sparse_buffers.scratch("topk-payload", 2 * k + 1, np.uint32)
    # steps 3 and 4 over the candidates, or over the whole input where the scan set
    # FALLBACK: each kernel reads which, so one launch each serves both (the grid covers
    # the whole input; tiles past the candidates return at once)
    for digit, (shift, width) in enumerate(DIGITS):
        digit_histogram[grid, THREADS, stream](found, bits, state, histogram, digit, shift, width)
    above = sparse_buffers.scratch("topk-above", grid, np.int64)
    equal = sparse_buffers.scratch("topk-equal", grid, np.int64)
    _count_kept[grid, THREADS, stream](found, bits, state, above, equal)
    _write_pairs[grid, THREADS, stream](found, index, bits, state, above, equal, k, payload, zero, p)
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
        raise ValueError("topk input contains NaN or inf")
    return selected


def select_topk_feedback(g, e, lam: float, e_out, k: int, reuse=None) -> tuple | None:
    """Error feedback fused into top-k: e_out = p = g + lam * e in one checked pass, the
    pairs of top-k(p), and the chosen entries of e_out zeroed (exactly p - D(c)). The
    pairs land in ``reuse`` (the key's previous payload) where it is one of ours.
    None when p is not finite (e_out then holds garbage; it must not be e)."""
    state, epoch = _start()
    compensate_flagged(g, e, lam, e_out, state[NONFINITE:NONFINITE + 1], epoch)
    return _land(_select(e_out, k, state, True, epoch), k, reuse, epoch)
