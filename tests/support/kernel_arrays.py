"""A simulated kernel's array arguments as the plain numpy arrays behind them.

Numba's CUDA simulator hands a kernel each array argument wrapped twice
(``FakeWithinKernelCUDAArray`` around ``FakeCUDAArray``), so that a structured array's
fields read as attributes (``a.x`` for ``a['x']``), a behaviour the simulator itself marks
for removal. For every other array the wrapper only forwards: an element read goes through
two Python calls, and an attribute such as ``shape`` lists ``dir()`` of the array first. In
the scripts' kernels (no structured arrays) that was most of the time per element. Here a
kernel gets the array itself, as it already gets its shared and local arrays: the same
elements, views, dtypes and arithmetic; a structured array keeps the wrapper.
"""
from numba.cuda.simulator import kernel

_wrapped = kernel.FakeWithinKernelCUDAArray


def _within_kernel(device_array):
    array = device_array._ary
    return _wrapped(device_array) if array.dtype.fields is not None else array


def install() -> None:
    kernel.FakeWithinKernelCUDAArray = _within_kernel
