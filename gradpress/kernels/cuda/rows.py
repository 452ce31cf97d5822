"""Row extraction on the GPU: the non-zero rows of a dense (rows x width) gradient.

Byte-identical to ``cpu/rows.py`` (``nonzero_rows`` then ``gather_rows``): the indices
come out in increasing order and the values are copied, not computed. No thread ever
claims an output slot by an atomic counter, the way Zen's published code inserts and
loses indices under contention: each block counts its non-zero rows, the host turns
the counts into offsets, and each block then writes its rows in order from its offset.
"""
import numpy as np
from numba import cuda, int32

from . import scratch
from .device import THREADS, as_device, blocks, stream


@cuda.jit(cache=True)
def _flag_rows(m, flags, block_counts):
    r = cuda.grid(1)
    nonzero = 0
    if r < m.shape[0]:
        for c in range(m.shape[1]):
            if m[r, c] != 0:
                nonzero = 1
                break
        flags[r] = nonzero
    counts = cuda.shared.array(THREADS, int32)
    counts[cuda.threadIdx.x] = nonzero
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        total = 0
        for t in range(THREADS):
            total += counts[t]
        block_counts[cuda.blockIdx.x] = total


@cuda.jit(cache=True)
def _compact(flags, block_offsets, out):
    if cuda.threadIdx.x == 0:  # a block's rows, in order, from the block's offset
        base = cuda.blockIdx.x * THREADS
        at = block_offsets[cuda.blockIdx.x]
        for t in range(THREADS):
            r = base + t
            if r < flags.shape[0] and flags[r] != 0:
                out[at] = r
                at += 1


@cuda.jit(cache=True)
def _gather(m, indices, out):
    j = cuda.grid(1)
    width = m.shape[1]
    if j < indices.shape[0] * width:
        row = j // width
        out[row, j - row * width] = m[indices[row], j - row * width]


def nonzero_rows(m) -> tuple[np.ndarray, np.ndarray]:
    """Indices (int64, increasing) and values (float32, on the host: arrays of their own) of
    the rows of the 2-D float32 device array (or CUDA tensor) ``m`` that hold any non-zero
    value. Waits for the device twice (the count, then the rows): call it where waiting
    costs nothing else (``worker/row_finder.py``). Its device scratch and pinned staging
    are this thread's, reused (a fresh device array per call costs a cuMemFree later, which
    waits for the whole device)."""
    m = as_device(m)
    rows, width = int(m.shape[0]), int(m.shape[1])
    nblocks = blocks(rows)
    s = stream()
    flags = scratch.grown("rows-flags", (max(rows, 1),), np.uint8)
    block_counts = scratch.grown("rows-counts", (nblocks,), np.int64)
    _flag_rows[nblocks, THREADS, s](m, flags, block_counts)
    counts = scratch.pinned("rows-counts", nblocks, np.int64)
    block_counts.copy_to_host(counts, stream=s)
    s.synchronize()
    offsets = scratch.pinned("rows-offsets", nblocks, np.int64)
    offsets[0] = 0
    np.cumsum(counts[:-1], out=offsets[1:])
    n = int(offsets[-1] + counts[-1])
    block_offsets = scratch.grown("rows-offsets", (nblocks,), np.int64)
    block_offsets.copy_to_device(offsets, stream=s)
    indices = scratch.grown("rows-indices", (max(n, 1),), np.int64)
    _compact[nblocks, THREADS, s](flags, block_offsets, indices)
    host_indices = scratch.pinned("rows-indices", n, np.int64)
    host_values = scratch.pinned("rows-values", n * width, np.float32)
    if n:
        values = scratch.grown("rows-values", (n, width), np.float32)
        _gather[blocks(n * width), THREADS, s](m, indices, values)
        indices[:n].copy_to_host(host_indices, stream=s)
        values.reshape(n * width).copy_to_host(host_values, stream=s)
        s.synchronize()
    return host_indices.copy(), host_values.reshape(n, width).copy()

