"""Norms on the GPU in the summation order of ``kernels.reduction``, reduced on the device.

``launch_totals`` queues one kernel: one block of 64 threads per chunk, thread j being
lane j (a warp's loads are 32 consecutive floats), each chunk's lanes paired in shared
memory as ``lane_tree`` pairs them; the last block to finish then pairs the chunk values
level by level as ``pairwise_total`` does (a ticket drawn after a fence, as in CUDA's
threadfence reduction: a second, one-block kernel cost one more launch, about 25 us of the
host's time on an H200, per partition). The totals stay on the device: an encoder's next
kernel derives its scale or norm from them, and nothing comes back to the host before the
payload does.

``load`` uses no ``cuda.*`` inside: the simulator swaps a device function's module's
``cuda`` per call, which raced between its threads until ``tests/support/cudasim_races.py``
closed it; ``_pair_totals`` needs barriers, as ``blockscan``'s device functions do.
"""
from typing import Any

import numpy as np
from numba import config, cuda, float32, float64, uint32

from gradpress.kernels.cuda import device, scratch
from gradpress.kernels.cuda.compensation import compensated
from gradpress.kernels.cuda.device import THREADS, blocks, device_line_padded, line_padded
from gradpress.kernels.reduction import CHUNK, LANES, chunk_count

# threads of the one block that pairs the chunk values (a power of two); fewer under the
# simulator, which runs each as a Python thread
TOTAL_THREADS = 32 if config.ENABLE_CUDASIM else 256
_SHARED_VALUES = 2 * TOTAL_THREADS  # levels with at most this many values pair in shared memory
# the same in ``_norms``' last block, of LANES threads. Every block reserves the room: with
# 4 KiB a block holds 7.5 KiB of shared memory in all, and an H100's SM 30 of them (its
# most, 32, 2,048 threads, would take 240 KiB; another 12 KiB a block would leave 12)
_LAST_BLOCK_VALUES = 2 * LANES
_FLOAT32_MAX = np.float32(3.4028235e38)
ABS, SQUARE, LARGEST = 0, 1, 2  # rows of the chunk values and of the totals


@cuda.jit(device=True, inline=True)
def load(g, e, lam, feedback, i):
    """p_i = g_i + lam * e_i with error feedback (``compensation.compensated``), else g_i."""
    if feedback:
        return compensated(g[i], lam, e[i])
    return g[i]


@cuda.jit(cache=True)
def _norms(g, e, lam, feedback, seg_len, seg_chunks, work, totals, ticket):
    """Block c: work[0, ABS, c] = sum |p| and work[0, SQUARE, c] = sum p^2 over chunk c in
    the order of ``kernels.reduction``, work[0, LARGEST, c] = largest |p| (inf for NaN/inf:
    float32 maxima order as their bits do). The elements are segments of ``seg_len`` (the
    last one shorter: a tensor's partitions), each cut into chunks from its own start, the
    ``seg_chunks`` chunks of segment s being blocks s * seg_chunks onwards, and its columns
    of ``work`` starting at a cache line of their own (``device.line_padded``). The last block
    of a segment to finish (the ticket ``ticket[s]`` it draws, after a fence that makes its
    chunk's values visible to every block) then pairs the segment's chunk values into
    totals[3s:3s + 3] (``_pair_totals``) and sets its ticket back to 0 for the next launch:
    one launch where a second, one-block kernel cost another, and one for all the segments."""
    c = cuda.blockIdx.x
    j = cuda.threadIdx.x
    s = c // seg_chunks
    first = s * seg_chunks  # the segment's first chunk
    chunks = cuda.gridDim.x - first  # (no min(): it mixes integer types)
    if chunks > seg_chunks:
        chunks = seg_chunks
    column = s * device_line_padded(seg_chunks)  # the segment's first column of ``work``
    base = s * seg_len
    end = base + seg_len
    if end > g.shape[0]:
        end = g.shape[0]
    lanes = cuda.shared.array((2, 3, LANES), float64)  # read from one half, write the other
    total = 0.0
    squares = 0.0
    largest = float32(0.0)
    start = base + (c - first) * CHUNK + j
    for m in range(CHUNK // LANES):
        i = start + m * LANES
        if i < end:
            p = load(g, e, lam, feedback, i)
            v = float64(p)
            total += abs(v)
            squares += v * v  # exact in float64: a fused multiply-add changes nothing
            magnitude = abs(p)
            if not magnitude <= _FLOAT32_MAX:
                magnitude = float32(np.inf)
            largest = max(largest, magnitude)
    lanes[0, ABS, j] = total
    lanes[0, SQUARE, j] = squares
    lanes[0, LARGEST, j] = largest
    src = 0
    width = LANES
    while width > 1:  # lane_tree's pairing, one barrier a level
        width //= 2
        cuda.syncthreads()
        if j < width:
            for row in range(2):
                lanes[1 - src, row, j] = lanes[src, row, 2 * j] + lanes[src, row, 2 * j + 1]
            lanes[1 - src, LARGEST, j] = max(lanes[src, LARGEST, 2 * j], lanes[src, LARGEST, 2 * j + 1])
        src = 1 - src
    last = cuda.shared.array(1, uint32)
    if j == 0:  # thread 0 wrote the last level itself
        for row in range(3):
            work[0, row, column + c - first] = lanes[src, row, 0]
        cuda.threadfence()
        last[0] = 1 if cuda.atomic.add(ticket, s, 1) == chunks - 1 else 0
    cuda.syncthreads()
    if last[0] == 0:
        return  # the whole block
    values = cuda.shared.array((2, 2, _LAST_BLOCK_VALUES), float64)
    top = cuda.shared.array(LANES, float64)
    _pair_totals(work[:, :, column:column + chunks], totals[3 * s:3 * s + 3], j, LANES, values, top)
    if j == 0:
        ticket[s] = 0


@cuda.jit(device=True)
def _pair_totals(work, totals, t, threads, values, top):
    """By the ``threads`` threads of one block (a power of two; ``t`` this one's):
    totals[ABS] and totals[SQUARE] = ``pairwise_total`` of the chunk values in work[0],
    totals[LARGEST] their largest; ``work`` is overwritten. Levels of more values than
    ``values`` (shared, (2, 2, S)) holds pair in global memory (work[0] and work[1] in
    turn), the last ones in shared memory; ``top`` (shared, ``threads``) takes the maxima.
    The pairs are the same whatever the thread count and S: only who computes them moves."""
    n = work.shape[2]
    room = values.shape[2]
    src = 0
    while n > room:
        half = n // 2
        for j in range(t, half, threads):
            for row in range(2):
                work[1 - src, row, j] = work[src, row, 2 * j] + work[src, row, 2 * j + 1]
        if n % 2 and t == 0:
            for row in range(2):
                work[1 - src, row, half] = work[src, row, n - 1]
        n = half + n % 2
        src = 1 - src
        cuda.syncthreads()
    for j in range(t, n, threads):
        for row in range(2):
            values[0, row, j] = work[src, row, j]
    largest = 0.0
    for j in range(t, work.shape[2], threads):  # any order gives the same maximum
        largest = max(largest, work[0, LARGEST, j])
    top[t] = largest
    src = 0
    cuda.syncthreads()
    while n > 1:
        half = n // 2
        for j in range(t, half, threads):
            for row in range(2):
                values[1 - src, row, j] = values[src, row, 2 * j] + values[src, row, 2 * j + 1]
        if n % 2 and t == 0:
            for row in range(2):
                values[1 - src, row, half] = values[src, row, n - 1]
        n = half + n % 2
        src = 1 - src
        cuda.syncthreads()
    width = threads
    while width > 1:
        width //= 2
        if t < width:
            top[t] = max(top[t], top[t + width])
        cuda.syncthreads()
    if t == 0:
        totals[ABS] = values[src, ABS, 0] if n == 1 else 0.0
        totals[SQUARE] = values[src, SQUARE, 0] if n == 1 else 0.0
        totals[LARGEST] = top[0]


@cuda.jit(cache=True)
def _totals(work, totals):
    """``_pair_totals`` alone, by one block of ``TOTAL_THREADS``, over chunk values the
    caller gives: the tests' way to reach its switch from global to shared memory, which
    takes thousands of chunks through ``_norms``."""
    values = cuda.shared.array((2, 2, _SHARED_VALUES), float64)
    top = cuda.shared.array(TOTAL_THREADS, float64)
    _pair_totals(work, totals, cuda.threadIdx.x, TOTAL_THREADS, values, top)


def launch_totals(g: Any, e: Any, lam: np.float64, feedback: bool, seg_len: int = 0) -> Any:
    """Queue, on gradpress's stream, the norms of p (of g alone without ``feedback``) in
    each segment of ``seg_len`` elements (0: one segment, all of g): a device float64 array
    of 3 per segment (sum |p|, sum p^2, largest |p| with inf for a NaN/inf) that the
    encoder's next kernel reads; nothing comes back to the host. One launch."""
    n = g.shape[0]
    seg_len = seg_len or max(n, 1)
    segments = max(1, -(-n // seg_len))
    seg_chunks = chunk_count(seg_len)
    last_chunks = max(1, chunk_count(n - (segments - 1) * seg_len))
    chunks = (segments - 1) * seg_chunks + last_chunks
    # each segment's columns on cache lines of their own, each row too (line_padded)
    columns = (segments - 1) * line_padded(seg_chunks) + line_padded(last_chunks)
    if segments == 1:
        work = scratch.device_array((2, 3, columns), np.float64)
        totals = scratch.device_array((3,), np.float64)
    else:  # a tensor's partitions: one buffer for every tensor, not one per size
        work = scratch.grown("norms-work", (2, 3, columns), np.float64)
        totals = scratch.grown("norms-totals", (3 * segments,), np.float64)
    ticket = scratch.zeroed((segments,), np.uint32, "norms-ticket")  # (each left at 0)
    _norms[chunks, LANES, device.stream()](g, e, lam, feedback, seg_len, seg_chunks, work, totals, ticket)
    return totals


@cuda.jit(cache=True)
def _largest_bits(x_bits, largest):
    """largest[0] = max(largest[0], the largest |x| bits) (NaN's above inf's): a block's
    maximum in shared memory, then one atomic per block."""
    top = cuda.shared.array(THREADS, uint32)
    t = cuda.threadIdx.x
    best = uint32(0)
    for i in range(cuda.grid(1), x_bits.shape[0], cuda.gridsize(1)):
        best = max(best, x_bits[i] & uint32(0x7FFFFFFF))
    top[t] = best
    width = THREADS
    while width > 1:
        width //= 2
        cuda.syncthreads()
        if t < width:
            top[t] = max(top[t], top[t + width])
    if t == 0:
        cuda.atomic.max(largest, 0, top[0])


@cuda.jit(cache=True)
def _clear(word):
    word[0] = 0


_MOST_BLOCKS = 4096  # a grid-stride loop beyond: enough blocks to fill any card


def max_abs_bits(x: Any) -> int:
    """Largest |x_i| as float32 bits (>= ``INF_BITS`` for a NaN or inf); one host read."""
    largest = scratch.device_array((1,), np.uint32)
    stream = device.stream()
    _clear[1, 1, stream](largest)
    grid = min(blocks(x.shape[0]), _MOST_BLOCKS)
    _largest_bits[grid, THREADS, stream](x.view(np.uint32), largest)
    host = scratch.pinned("largest", 1, np.uint32)
    largest.copy_to_host(host, stream=stream)
    stream.synchronize()
    return int(host[0])

