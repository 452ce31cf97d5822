"""onebit encoder on the GPU: one thread per output byte."""
import numpy as np
from numba import cuda

from gradpress.kernels.bitlayout import packed_nbytes
from gradpress.kernels.cuda import norms
from gradpress.kernels.cuda.device import THREADS, blocks
from gradpress.kernels.scaling import reject_non_finite, scale_from_norms


@cuda.jit
def _pack_signs(x, bits):
    b = cuda.grid(1)
    if b >= bits.shape[0]:
        return
    byte = 0
    for j in range(8):
        i = 8 * b + j
        if i < x.shape[0] and x[i] < 0:
            byte |= 1 << j
    bits[b] = byte


def encode(x, scaling: str) -> tuple[dict, list]:
    n = x.shape[0]
    l1 = norms.abs_sum(x)
    reject_non_finite(l1)
    l2 = norms.square_sum(x) if scaling == "l2" else 0.0
    bits = cuda.device_array(packed_nbytes(n, 1), np.uint8)
    _pack_signs[blocks(bits.shape[0]), THREADS](x, bits)
    scale = np.array([scale_from_norms(scaling, n, l1, l2)], np.float32)
    return {}, [scale, bits.copy_to_host()]
