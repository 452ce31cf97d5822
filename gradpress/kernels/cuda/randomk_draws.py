"""random-k's index sets drawn on the GPU: the sets Floyd's algorithm draws on the host
(``kernels/cpu/randomk.py``), byte for byte, found from all the draws at once.

Floyd's step t (j = n - k + t, r_t = below(draw t, j + 1)) adds r_t unless it is in
already, and j then, so each step seems to need every step before it. What the steps leave
can be read off the draws instead:
- a value below n - k is in iff some step drew it (no j is that small);
- j_s is in iff some step drew it, or step s collided: r_s was in before step s. That is
  so iff an earlier step drew the same value (r_t = r_s, t < s), or r_s is j_u of an
  earlier step u that collided itself (no step before u can draw j_u: r_t <= j_t < j_u).
So every step draws, keeps the first step of each value in a hash table (an atomic
compare-and-swap claims the value's slot, an atomic min keeps the step) and sets the
value's bit; then every step follows u = r_s - (n - k) back while it names an earlier
step, until a value drawn before it (collided) or not, and a collided step sets j_s's bit.
The chains are short: a hop needs a draw among the top k of its range. The bitmap is then
read in order (a count per block of words, one block's scan of the counts, each thread
writing the bits of its run of words from its place): the indices, increasing. Six
launches (four up to 32,768 elements: one block writes them all), no host work, no copy,
nothing to wait for.

A tensor's partitions are drawn at once: segments of ``seg_len`` elements (the last one
``n_last``), each with its own stream and k (``k_full``; ``k_last`` for the last), share
one table and one bitmap over the whole tensor, so their indices come out as one increasing
list of indices into the tensor.
"""
import numpy as np
from numba import cuda, int64

from gradpress.kernels.cuda import scratch
from gradpress.kernels.cuda.blockscan import exclusive_scan, scan_in_place
from gradpress.kernels.cuda.device import THREADS, blocks, stream
from gradpress.kernels.cuda.uploads import upload
from gradpress.kernels.rng import below_py, draw_bits_py

_draw_bits = cuda.jit(device=True)(draw_bits_py)
_below = cuda.jit(device=True)(below_py)
_EMPTY = np.uint32(0xFFFFFFFF)   # a free slot of the table (no index reaches it)
_NO_STEP = np.int32(0x7FFFFFFF)  # above every step
_RUN = 8  # bitmap words a thread counts and writes out, in a row (its output follows the one before)
_ONE_BLOCK = THREADS * _RUN * 32  # elements whose bitmap one block writes out (no count, no scan)


@cuda.jit(device=True)
def _where(t, streams, seg_len, k_full, n_last, k_last):
    """Draw t's segment, its step there, and the segment's n and k."""
    last = streams.shape[0] - 1
    s = t // k_full
    if s > last:
        s = last
    if s == last:
        return s, t - s * k_full, n_last, k_last
    return s, t - s * k_full, seg_len, k_full


@cuda.jit(device=True)
def _set_bit(bitmap, index):
    cuda.atomic.or_(bitmap, index >> 5, np.uint32(1 << (index & 31)))


@cuda.jit(cache=True)
def _clear(keys, firsts, bitmap):
    i = cuda.grid(1)
    if i < keys.shape[0]:
        keys[i] = _EMPTY
        firsts[i] = _NO_STEP
    if i < bitmap.shape[0]:
        bitmap[i] = 0


@cuda.jit(cache=True)
def _draw(streams, seg_len, k_full, n_last, k_last, draws, keys, firsts, bitmap):
    """Every step's draw (into ``draws``, its value within its segment), the first step of
    each index (``firsts`` at the index's slot in ``keys``) and each index's bit."""
    t = cuda.grid(1)
    if t >= draws.shape[0]:
        return
    s, step, n, k = _where(t, streams, seg_len, k_full, n_last, k_last)
    r = np.int64(_below(_draw_bits(streams[s], np.uint64(step)), np.uint64(n - k + step + 1)))
    draws[t] = r
    index = s * seg_len + r
    mask = keys.shape[0] - 1
    slot = index & mask
    while True:  # linear probing; the table is at least twice the draws
        held = cuda.atomic.cas(keys, slot, _EMPTY, np.uint32(index))
        if held == _EMPTY or held == index:
            cuda.atomic.min(firsts, slot, np.int32(step))
            break
        slot = (slot + 1) & mask
    _set_bit(bitmap, index)


@cuda.jit(device=True)
def _first_step(keys, firsts, index):
    mask = keys.shape[0] - 1
    slot = index & mask
    while keys[slot] != index:
        slot = (slot + 1) & mask
    return firsts[slot]


@cuda.jit(cache=True)
def _collide(streams, seg_len, k_full, n_last, k_last, draws, keys, firsts, bitmap):
    """Each step that collided sets the bit of its j (module docstring)."""
    t = cuda.grid(1)
    if t >= draws.shape[0]:
        return
    s, step, n, k = _where(t, streams, seg_len, k_full, n_last, k_last)
    low, first_draw = n - k, s * k_full
    at = step
    collided = False
    while True:
        r = np.int64(draws[first_draw + at])
        if _first_step(keys, firsts, s * seg_len + r) < at:
            collided = True
            break
        if r >= low and r - low < at:
            at = r - low
        else:
            break
    if collided:
        _set_bit(bitmap, s * seg_len + low + step)


@cuda.jit(device=True)
def _words_of(bitmap):
    """This thread's run of ``_RUN`` words: [first, end)."""
    first = (cuda.blockIdx.x * THREADS + cuda.threadIdx.x) * _RUN
    end = first + _RUN
    if end > bitmap.shape[0]:
        end = bitmap.shape[0]
    return first, end


@cuda.jit(device=True)
def _bits_in(bitmap, first, end):
    count = np.int64(0)
    for w in range(first, end):
        count += cuda.popc(bitmap[w])
    return count


@cuda.jit(cache=True)
def _count_words(bitmap, block_counts):
    first, end = _words_of(bitmap)
    scan = cuda.shared.array(THREADS, int64)
    _, total = exclusive_scan(scan, cuda.threadIdx.x, _bits_in(bitmap, first, end))
    if cuda.threadIdx.x == 0:
        block_counts[cuda.blockIdx.x] = total


@cuda.jit(cache=True)
def _scan_blocks(block_counts):
    scan = cuda.shared.array(THREADS, int64)
    scan_in_place(block_counts, block_counts.shape[0], scan, cuda.threadIdx.x)


@cuda.jit(cache=True)
def _emit(bitmap, block_offsets, out):
    """Each thread's run of words, their set bits lowest first, from its place in the output."""
    first, end = _words_of(bitmap)
    scan = cuda.shared.array(THREADS, int64)
    before, _ = exclusive_scan(scan, cuda.threadIdx.x, _bits_in(bitmap, first, end))
    at = block_offsets[cuda.blockIdx.x] + before
    for w in range(first, end):
        word = bitmap[w]
        while word != 0:
            out[at] = np.uint32(w * 32 + cuda.ffs(word) - 1)
            at += 1
            word = np.uint32(word & (word - np.uint32(1)))  # the lowest set bit cleared


def draw(seg_len: int, k_full: int, n_last: int, k_last: int, streams: list, role: str):
    """The indices of every segment's stream (module docstring), increasing, as a device
    uint32 array in ``role``'s reused scratch; queued on gradpress's stream. One segment:
    ``draw(n, k, n, k, [stream], role)`` is ``random_indices(n, k, stream)``."""
    segments = len(streams)
    n_total = seg_len * (segments - 1) + n_last
    total = k_full * (segments - 1) + k_last
    if (not 0 <= n_total < int(_EMPTY) or not 0 <= k_full <= seg_len or not 0 <= k_last <= n_last
            or (segments > 1 and k_full == 0)):
        raise ValueError(f"random-k draws of {k_full} (last {k_last}) in segments of {seg_len} (last {n_last}), "
                         f"{n_total} in all: out of range")
    out = scratch.grown(role, (total,), np.uint32)
    if total == 0:  # (an empty tensor: random_indices(0, 0) is empty too)
        return out
    size = 1 << (2 * total - 1).bit_length()  # a power of two, at least twice the draws
    keys = scratch.grown("randomk-keys", (size,), np.uint32)
    firsts = scratch.grown("randomk-firsts", (size,), np.int32)
    words = (n_total + 31) // 32
    bitmap = scratch.grown("randomk-bitmap", (words,), np.uint32)
    draws = scratch.grown("randomk-draws", (total,), np.uint32)
    word_blocks = blocks(-(-words // _RUN))
    on_device = upload(np.asarray(streams, np.uint64), "randomk-streams")
    s = stream()
    shape = (seg_len, k_full, n_last, k_last)
    _clear[blocks(max(size, words)), THREADS, s](keys, firsts, bitmap)
    _draw[blocks(total), THREADS, s](on_device, *shape, draws, keys, firsts, bitmap)
    _collide[blocks(total), THREADS, s](on_device, *shape, draws, keys, firsts, bitmap)
    if word_blocks == 1:  # (a partition of up to 32,768 elements) its one block starts at 0: four launches
        block_offsets = scratch.zeroed((1,), np.int64, "randomk-no-offset")
    else:
        block_offsets = scratch.grown("randomk-blocks", (word_blocks,), np.int64)
        _count_words[word_blocks, THREADS, s](bitmap, block_offsets)
        _scan_blocks[1, THREADS, s](block_offsets)
    _emit[word_blocks, THREADS, s](bitmap, block_offsets, out)
    return out


def warm_up() -> None:
    """Compile every kernel ``draw`` may launch: a draw past one block counts and scans the
    blocks' words, which the codecs' warm-ups on tiny tensors never reach (on an H200 those
    two kernels then compiled on the communication thread, at a job's first large draw)."""
    draw(_ONE_BLOCK + 1, 1, _ONE_BLOCK + 1, 1, [0], "randomk-warm-up")
