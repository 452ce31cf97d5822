"""Element-wise operations of the stateful wrappers, on host (Numba) or device (numba.cuda)
arrays alike, so ErrorFeedback and Momentum are written once."""
from typing import Any

import numpy as np

from gradpress.compressors.arrays import as_float32, check_vector, is_device_array
from gradpress.kernels.cpu import elementwise


class HostOps:
    """Operations on 1-D numpy arrays; state is float32, or float64 for float64 input."""

    @staticmethod
    def working(x: np.ndarray) -> np.ndarray:
        check_vector(x, "compress input")
        return x if x.dtype == np.float64 else as_float32(x)

    @staticmethod
    def empty_like(x: np.ndarray) -> np.ndarray:
        return np.empty_like(x)

    @staticmethod
    def landed(x: np.ndarray) -> None:
        """What a decompress wrote into ``x`` may be read: on a host it is there already."""

    add_scaled = staticmethod(elementwise.add_scaled)
    subtract = staticmethod(elementwise.subtract)
    all_finite = staticmethod(elementwise.all_finite)

    @staticmethod
    def adopt(state: Any, like: np.ndarray) -> Any:
        """A host state array as it is; one loaded with another dtype is left for
        ``check_same_layout`` to report."""
        return state


def ops_for(x: Any):
    """HostOps for numpy arrays, the device counterpart for CUDA arrays."""
    if is_device_array(x):
        from gradpress.kernels.cuda.elementwise import DeviceOps
        return DeviceOps
    return HostOps


def to_host(array: Any) -> np.ndarray:
    """A numpy copy of a state array (for ``state_dict``)."""
    if is_device_array(array):
        from gradpress.kernels.cuda import device
        return device.to_host(array)
    return np.array(array, copy=True)


def check_same_layout(state: Any, x: Any, key: int, what: str) -> None:
    if state.shape != x.shape or state.dtype != x.dtype or \
            is_device_array(state) != is_device_array(x):
        raise ValueError(f"key {key}: input changed from the {what} state's shape {state.shape} "
                         f"dtype {state.dtype} to {x.shape} {x.dtype}")
