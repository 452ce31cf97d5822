"""Row extraction on the GPU: the non-zero rows of a dense (rows x width) gradient.

Byte-identical to ``cpu/rows.py`` (``nonzero_rows`` then ``gather_rows``): the indices
come out in increasing order and the values are copied, not computed. No thread ever
claims an output slot by an atomic counter, the way Zen's published code inserts and
loses indices under contention: each block counts its non-zero rows, the host turns
the counts into offsets, and each block then writes its rows in order from its offset.
"""
import numpy as np
from numba import cuda, int32

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
    """Indices (int64, increasing) and values (float32, on the host) of the rows of the
    2-D float32 device array (or CUDA tensor) ``m`` that hold any non-zero value."""
    m = as_device(m)
    rows, width = int(m.shape[0]), int(m.shape[1])
    nblocks = blocks(rows)
    s = stream()
    flags = cuda.device_array(max(rows, 1), np.uint8, stream=s)
    block_counts = cuda.device_array(nblocks, np.int64, stream=s)
    _flag_rows[nblocks, THREADS, s](m, flags, block_counts)
    counts = block_counts.copy_to_host(stream=s)
    s.synchronize()
    offsets = np.zeros(nblocks, np.int64)
    np.cumsum(counts[:-1], out=offsets[1:])
    n = int(counts.sum())
    indices = cuda.device_array(max(n, 1), np.int64, stream=s)
    _compact[nblocks, THREADS, s](flags, cuda.to_device(offsets, stream=s), indices)
    values = cuda.device_array((max(n, 1), width), np.float32, stream=s)
    if n:
        _gather[blocks(n * width), THREADS, s](m, indices, values)
    host_indices, host_values = indices.copy_to_host(stream=s), values.copy_to_host(stream=s)
    s.synchronize()
    return host_indices[:n], host_values[:n]
