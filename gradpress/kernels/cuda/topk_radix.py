"""The shared layout of the GPU top-k (``topk.py``) and its radix select: the exact
threshold among the candidates (or, when the estimate was off, the whole input), found
digit by digit, high first. Each digit is a histogram in shared memory per block, summed
into a global one, and the pick of the bin where the rank is reached by the last block to
finish (``last_block``: one launch a digit, not two); ``state`` keeps the digits found so
far (PREFIX) and the rank still to take (RANK)."""
import numpy as np
from numba import config, cuda

from gradpress.kernels.cuda.blockscan import exclusive_scan

# threads per block: few under the simulator, which runs each as a Python thread (and so
# splits its small test arrays into several tiles, as large ones are split on a GPU)
THREADS = 8 if config.ENABLE_CUDASIM else 128
ITEMS = 8  # consecutive elements per thread: its pairs are written in index order
TILE = THREADS * ITEMS
BINS = 2048  # shared histogram: 8 KiB
DIGITS = ((20, 11), (10, 10), (0, 10))  # (shift, width) of the 31 key bits, high first
HISTOGRAM = len(DIGITS) * BINS  # a segment's global histogram: one per digit
# slots of ``state``
NONFINITE, ESTIMATE, COUNT, FALLBACK, PREFIX, RANK, TICKET = range(7)  # RANK: k, then still to take
# A segment's state is half a 128-byte line, shared with its neighbour's, unlike the tile
# counts (``device.line_padded``): every field a launch reads was written by an earlier
# launch, or by the reading segment's own last block once its other blocks had read it,
# so no SM can hold a stale copy of a field it reads
STATE = 8
ABS = np.uint32(0x7FFFFFFF)


@cuda.jit(device=True, inline=True)
def source_length(bits, direct, state):
    """Elements of the source: all of ``bits`` where the estimate was off (``direct``, the
    state's FALLBACK), else the COUNT candidates."""
    return bits.shape[0] if direct else state[COUNT]


@cuda.jit(device=True, inline=True)
def source_word(found, bits, direct, i):
    """Element ``i`` of the source as float32 bits: of the whole input, or of the candidates."""
    return bits[i] if direct else found[i]


@cuda.jit(device=True)
def last_block(state, t, flag):
    """Whether this block is the grid's last to get here, which then finishes what needs
    every block's part (a scan, a pick) in the same launch: each thread's writes are
    fenced, then thread 0 draws a ticket (state[TICKET]); the last block puts it back to 0
    for the next kernel. ``flag`` is shared (1); every thread of every block must call it."""
    cuda.threadfence()
    cuda.syncthreads()
    if t == 0:
        drawn = cuda.atomic.add(state, TICKET, 1)
        flag[0] = 1 if drawn == cuda.gridDim.x - 1 else 0
        if drawn == cuda.gridDim.x - 1:
            state[TICKET] = 0
    cuda.syncthreads()
    return flag[0] != 0


@cuda.jit(cache=True)
def digit_histogram(whole_found, whole_bits, seg_len, whole_state, whole_histogram, digit, shift, width):
    """Keys of the source (``source_length``) that share the threshold's digits found so
    far, by their next digit; then the last block picks the digit (``pick``). Launched
    over the whole input's tiles: those past the source only draw their ticket. Per
    segment of ``seg_len`` elements, the grid's second dimension (see ``topk._select``)."""
    s = cuda.blockIdx.y
    bits = whole_bits[s * seg_len:min(s * seg_len + seg_len, whole_bits.shape[0])]
    state = whole_state[s * STATE:s * STATE + STATE]
    histogram = whole_histogram[s * HISTOGRAM:s * HISTOGRAM + HISTOGRAM]
    capacity = whole_found.shape[0] // cuda.gridDim.y
    found = whole_found[s * capacity:(s + 1) * capacity]
    direct = state[FALLBACK]
    first = cuda.blockIdx.x * TILE
    length = source_length(bits, direct, state)
    local = cuda.shared.array(BINS, np.int32)
    scan = cuda.shared.array(THREADS, np.int64)
    flag = cuda.shared.array(1, np.int32)
    t = cuda.threadIdx.x
    if first < length:  # the whole block either way: its barriers are met
        for b in range(t, BINS, THREADS):
            local[b] = 0
        cuda.syncthreads()
        known = state[PREFIX] >> (shift + width)
        first += t * ITEMS
        for i in range(first, min(first + ITEMS, length)):
            key = np.int64(source_word(found, bits, direct, i) & ABS)
            if key >> (shift + width) == known:
                cuda.atomic.add(local, (key >> shift) & ((1 << width) - 1), 1)
        cuda.syncthreads()
        for b in range(t, 1 << width, THREADS):
            if local[b]:
                cuda.atomic.add(histogram, digit * BINS + b, local[b])
    if last_block(state, t, flag):
        pick(histogram, state, digit, shift, width, t, scan)


@cuda.jit(device=True)
def pick(histogram, state, digit, shift, width, t, scan):
    """By one block (``scan``: shared, a slot per thread): from the top, the bin where the
    rank is reached becomes the digit."""
    threads = scan.shape[0]
    rank = state[RANK]
    bins = 1 << width
    per = (bins + threads - 1) // threads
    top = bins - 1 - t * per  # this thread's bins, descending
    own = np.int64(0)
    for r in range(per):
        if top - r >= 0:
            own += histogram[digit * BINS + top - r]
    higher, _ = exclusive_scan(scan, t, own)
    if higher < rank <= higher + own:  # one thread: its bins hold the rank
        for r in range(per):
            count = histogram[digit * BINS + top - r]
            if higher + count >= rank:
                state[RANK] = rank - higher
                state[PREFIX] |= np.int64(top - r) << shift
                break
            higher += count
