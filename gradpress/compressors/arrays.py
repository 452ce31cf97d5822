"""Input and output array plumbing shared by all compressors: float32 views and casts,
and recognising device (CUDA) arrays without importing numba.cuda for host arrays."""
from typing import Any

import numpy as np

from gradpress.kernels.cpu import fp16

ACCEPTED_DTYPES = (np.float16, np.float32, np.float64)


def is_device_array(x: Any) -> bool:
    """Whether ``x`` lives on a GPU (a torch CUDA tensor, any ``__cuda_array_interface__``
    object, or a simulator device array)."""
    if isinstance(x, np.ndarray):
        return False
    return hasattr(x, "__cuda_array_interface__") or type(x).__name__ == "FakeCUDAArray"


def check_vector(x: np.ndarray, what: str) -> None:
    """``x`` must be a 1-D contiguous float16/32/64 numpy array."""
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{what} must be a numpy array or a CUDA array, got {type(x).__name__}")
    if x.ndim != 1 or not x.flags.c_contiguous or x.dtype.type not in ACCEPTED_DTYPES:
        raise ValueError(f"{what} must be a 1-D contiguous float16/float32/float64 array, "
                         f"got shape {x.shape} dtype {x.dtype}")


def as_float32(x: np.ndarray) -> np.ndarray:
    """``x`` as float32 (no copy when it already is; float16 widened exactly)."""
    if x.dtype == np.float32:
        return x
    if x.dtype == np.float16:
        out = np.empty(x.shape[0], np.float32)
        fp16.from_half_bits(x.view(np.uint16), out)
        return out
    return x.astype(np.float32)


def store_float32(values: np.ndarray, out: np.ndarray) -> None:
    """``out[:] = values`` rounding as numpy's astype does."""
    if out.dtype == np.float16:
        fp16.to_half_bits(np.ascontiguousarray(values, np.float32), out.view(np.uint16))
    else:
        out[:] = values


def divided(values: Any, divisor: int) -> Any:
    """``values / divisor`` in float32 (``values`` itself for 1): a decoder divides the few
    values its payload carries, each landing as the same bits as an element of the
    decoded array divided afterwards."""
    if divisor == 1:
        return values
    return np.divide(values, np.float32(divisor), dtype=np.float32)


def divide_in_place(out: np.ndarray, divisor: int) -> None:
    """``out /= divisor`` in ``out``'s own dtype (nothing for 1): what a decoder does where
    its payload has no few values to divide instead (fp16, raw, a non-float32 output)."""
    if divisor != 1:
        np.divide(out, divisor, out=out)
