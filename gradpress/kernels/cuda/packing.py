"""Coalesced packing of fixed-width codes (``kernels.bitlayout``) on the GPU.

A block of ``PACK_THREADS`` threads owns ``8 // width * PACK_THREADS`` consecutive
elements: thread t codes elements t, t + PACK_THREADS, ... of it (a warp reads
consecutive floats) into a stage in shared memory (``cuda.shared.array(STAGE, uint8)``),
and after a ``cuda.syncthreads()`` packs byte t of the block from the stage. One thread
per byte reading its own 8 elements would read 32 bytes apart per thread, uncoalesced.
These device functions take the thread and block index as arguments: see ``norms``.
"""
from numba import config, cuda

# The simulator runs every thread as a Python thread: small blocks there keep the tests
# fast (and give small arrays several blocks); nothing here depends on the size.
PACK_THREADS = 32 if config.ENABLE_CUDASIM else 256
STAGE = 8 * PACK_THREADS  # codes a block stages at most (onebit's 1-bit codes)


def pack_blocks(nbytes: int) -> int:
    """Blocks that cover ``nbytes`` packed bytes."""
    return max(1, (nbytes + PACK_THREADS - 1) // PACK_THREADS)


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
