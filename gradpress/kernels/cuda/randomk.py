"""random-k gather on the GPU. The index set does not depend on the data, so it is chosen
on the host by the CPU function (identical by construction) and copied over."""
import numpy as np
from numba import cuda

from gradpress.kernels.cuda.device import THREADS, blocks
from gradpress.kernels.cuda.elementwise import compensate_checked


@cuda.jit
def _gather_scaled(x, indices, scale, values):
    j = cuda.grid(1)
    if j < indices.shape[0]:
        values[j] = np.float32(np.float64(x[indices[j]]) * scale)


def gather_scaled(x, indices: np.ndarray, scale: float) -> np.ndarray:
    values = cuda.device_array(indices.shape[0], np.float32)
    _gather_scaled[blocks(indices.shape[0]), THREADS](x, cuda.to_device(indices), scale, values)
    return values.copy_to_host()


@cuda.jit
def _take_feedback(e_out, indices, scale, values):
    j = cuda.grid(1)
    if j < indices.shape[0]:
        i = indices[j]
        value = np.float32(np.float64(e_out[i]) * scale)
        values[j] = value
        e_out[i] = e_out[i] - value


def gather_feedback(g, e, lam: float, e_out, indices: np.ndarray,
                    scale: float) -> np.ndarray | None:
    """Error feedback fused into random-k: e_out = p in one checked pass, then the chosen
    values are read out and subtracted. None when anything is not finite (e_out then holds
    garbage; it must not be e)."""
    if not compensate_checked(g, e, lam, e_out):
        return None
    values = cuda.device_array(indices.shape[0], np.float32)
    _take_feedback[blocks(indices.shape[0]), THREADS](e_out, cuda.to_device(indices), scale,
                                                     values)
    host = values.copy_to_host()
    return host if np.isfinite(host).all() else None
