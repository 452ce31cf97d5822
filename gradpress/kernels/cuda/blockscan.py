"""Prefix sums inside one CUDA block, in shared memory (no warp intrinsics, so that they
run under numba's simulator too), for order-preserving compaction: a thread's place in
the output is the sum of the counts of everything before it."""
import numpy as np
from numba import cuda


@cuda.jit(device=True)
def exclusive_scan(scan, t, value):
    """(sum of ``value`` over the block's threads below ``t``, sum over all of them);
    ``scan`` is a shared int64 array of one slot per thread. Every thread must call it."""
    size = scan.shape[0]
    scan[t] = value
    cuda.syncthreads()
    step = 1
    while step < size:  # Hillis-Steele: log2(size) rounds
        add = scan[t - step] if t >= step else 0
        cuda.syncthreads()
        scan[t] += add
        cuda.syncthreads()
        step *= 2
    inclusive = scan[t]
    total = scan[size - 1]
    cuda.syncthreads()  # before the caller writes ``scan`` again
    return inclusive - value, total


@cuda.jit(device=True)
def scan_in_place(counts, length, scan, t):
    """``counts[:length]`` becomes its exclusive prefix sum, by one block (each thread a
    contiguous run, so order is kept); returns the total. Every thread must call it."""
    size = scan.shape[0]
    per = (length + size - 1) // size
    start = min(t * per, length)
    end = min(start + per, length)
    own = np.int64(0)
    for i in range(start, end):
        own += counts[i]
    before, total = exclusive_scan(scan, t, own)
    for i in range(start, end):
        count = counts[i]
        counts[i] = before
        before += count
    return total
