"""Coalesced packing of fixed-width codes (``kernels.bitlayout``) on the GPU.

A block of ``PACK_THREADS`` threads owns ``8 // width * PACK_THREADS`` consecutive
elements: thread t codes elements t, t + PACK_THREADS, ... of it (a warp reads
consecutive floats) into a stage in shared memory (``cuda.shared.array(STAGE, uint8)``),
and after a ``cuda.syncthreads()`` packs byte t of the block from the stage. One thread
per byte reading its own 8 elements would read 32 bytes apart per thread, uncoalesced.
These device functions take the thread and block index as arguments: see ``norms``.
"""
import numpy as np
from numba import config, cuda

from gradpress.kernels.bitlayout import packed_nbytes
from gradpress.kernels.cuda import scratch

# The simulator runs every thread as a Python thread: small blocks there keep the tests
# fast (and give small arrays several blocks); nothing here depends on the size.
PACK_THREADS = 32 if config.ENABLE_CUDASIM else 256
STAGE = 8 * PACK_THREADS  # codes a block stages at most (onebit's 1-bit codes)


def pack_blocks(nbytes: int) -> int:
    """Blocks that cover ``nbytes`` packed bytes."""
    return max(1, (nbytes + PACK_THREADS - 1) // PACK_THREADS)


def staged_segments(n: int, seg_len: int, width: int, role: str) -> tuple:
    """(layout, whole device allocation, [scales, codes]) for ``n`` elements coded in
    segments of ``seg_len`` (a tensor's partitions; the last one shorter): a float32 scale
    per segment, then every segment's ``width``-bit codes end to end, each from a byte of
    its own. One segment: the scratch kept per size (``scratch.staged``); several: the
    front of ``role``'s buffer grown to the largest tensor, not one per tensor size."""
    segments = max(1, -(-n // seg_len))
    tail = n - (segments - 1) * seg_len
    codes = (segments - 1) * packed_nbytes(seg_len, width) + packed_nbytes(tail, width)
    layout = scratch.Layout(((np.float32, segments), (np.uint8, codes)), 2)
    whole, views = scratch.staged(layout) if segments == 1 else scratch.grown_staged(role, layout)
    return layout, whole, views


def segments_grid(n: int, seg_len: int, width: int) -> tuple[int, int]:
    """(blocks of the grid, blocks per segment) that pack every segment's codes: each
    segment from a block of its own (``segment_block``)."""
    seg_blocks = pack_blocks(packed_nbytes(seg_len, width))
    segments = max(1, -(-n // seg_len))
    return (segments - 1) * seg_blocks + pack_blocks(packed_nbytes(n - (segments - 1) * seg_len, width)), seg_blocks


def segment_codes(codes, n: int, seg_len: int, width: int, s: int):
    """Segment s's codes, of all the segments' (``staged_segments``)."""
    start = s * packed_nbytes(seg_len, width)
    return codes[start:start + packed_nbytes(min(seg_len, n - s * seg_len), width)]


@cuda.jit(device=True, inline=True)
def segment_block(length, seg_len, seg_blocks):
    """(segment, block within it, its first element, its length) of this block, where each
    segment of ``seg_len`` elements of ``length`` (the last one shorter: a tensor's
    partitions) is packed by ``seg_blocks`` blocks."""
    s = cuda.blockIdx.x // seg_blocks
    base = s * seg_len
    return s, cuda.blockIdx.x - s * seg_blocks, base, min(length - base, seg_len)


@cuda.jit(device=True, inline=True)
def element(k, per_byte, t, block):
    """(place in the block's stage, element index) of thread t's k-th code."""
    local = k * PACK_THREADS + t
    return local, block * PACK_THREADS * per_byte + local


@cuda.jit(device=True, inline=True)
def pack_byte(stage, width, out, t, block):
    """Byte t of the block from the staged codes (codes past the end staged as 0)."""
    b = block * PACK_THREADS + t
    if b < out.shape[0]:
        per_byte = 8 // width
        byte = 0
        for j in range(per_byte):
            byte |= stage[t * per_byte + j] << (j * width)
        out[b] = byte
