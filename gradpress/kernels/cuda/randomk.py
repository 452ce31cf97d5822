"""random-k gather on the GPU. The index set does not depend on the data, so it is chosen
on the host by the CPU function (identical by construction) and copied over."""
import numpy as np
from numba import cuda

from gradpress.kernels.cuda.device import THREADS, blocks


@cuda.jit
def _gather_scaled(x, indices, scale, values):
    j = cuda.grid(1)
    if j < indices.shape[0]:
        values[j] = np.float32(np.float64(x[indices[j]]) * scale)


def gather_scaled(x, indices: np.ndarray, scale: float) -> np.ndarray:
    values = cuda.device_array(indices.shape[0], np.float32)
    _gather_scaled[blocks(indices.shape[0]), THREADS](x, cuda.to_device(indices), scale, values)
    return values.copy_to_host()
