"""Device-array plumbing: views of torch tensors / CUDA arrays, launches, copies."""
import contextlib
from typing import Any

import numpy as np
from numba import config, cuda

THREADS = 128  # threads per block


def blocks(threads: int) -> int:
    return max(1, (threads + THREADS - 1) // THREADS)


def as_device(x: Any) -> Any:
    """A numba device array viewing ``x`` (zero-copy)."""
    if config.ENABLE_CUDASIM:  # the simulator has no as_cuda_array; its arrays pass as is
        return x
    return cuda.as_cuda_array(x)


def on_device_of(x: Any):
    """A context in which numba launches on ``x``'s GPU (a torch CUDA tensor's device; the
    current one for anything else, and under the simulator)."""
    device = getattr(x, "device", None)
    if config.ENABLE_CUDASIM or getattr(device, "type", None) != "cuda" or device.index is None:
        return contextlib.nullcontext()
    return cuda.gpus[device.index]


def length(x: Any) -> int:
    return int(x.shape[0])


def itemsize(x: Any) -> int:
    size = getattr(x, "element_size", None)  # a torch tensor (bfloat16 has no numpy dtype)
    return int(size()) if callable(size) else np.dtype(x.dtype).itemsize


def float32_view(x: Any) -> Any:
    """``x`` as a float32 device array; torch tensors of other dtypes are converted first."""
    if len(x.shape) != 1:
        raise ValueError(f"compress input must be 1-D, got shape {tuple(x.shape)}")
    if "float32" not in str(x.dtype):
        if not hasattr(x, "float"):
            raise ValueError(f"device input must be float32 (or a torch tensor), got {x.dtype}")
        x = x.float()
    return as_device(x.contiguous() if hasattr(x, "contiguous") else x)


def to_host(x: Any) -> np.ndarray:
    """A host numpy copy of a device array or CUDA tensor."""
    if hasattr(x, "cpu") and hasattr(x, "numpy"):
        x = x.detach()
        return (x.float() if str(x.dtype) == "torch.bfloat16" else x).cpu().numpy()
    return as_device(x).copy_to_host()


def copy_from_host(host: np.ndarray, out: Any) -> None:
    """``out[:] = host`` for a device array or CUDA tensor of any float dtype."""
    if hasattr(out, "copy_"):
        import torch
        out.copy_(torch.from_numpy(host))
        return
    target = as_device(out)
    target.copy_to_device(host.astype(target.dtype, copy=False))


def empty(n: int, dtype: type) -> Any:
    return cuda.device_array(n, dtype)


def from_host(host: np.ndarray) -> Any:
    return cuda.to_device(np.ascontiguousarray(host))
