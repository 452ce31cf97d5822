"""fp16 encoder on the GPU: the hardware float32 -> float16 conversion rounds to nearest
even, as numpy does (NaN payload bits may differ)."""
import numpy as np
from numba import cuda

from gradpress.kernels.cuda.device import THREADS, blocks


@cuda.jit
def _to_half(x, half):
    i = cuda.grid(1)
    if i < x.shape[0]:
        half[i] = np.float16(x[i])


def to_half_bits(x) -> np.ndarray:
    half = cuda.device_array(x.shape[0], np.float16)
    _to_half[blocks(x.shape[0]), THREADS](x, half)
    return half.copy_to_host().view(np.uint16)
