"""A lock around numba's CUDA simulator's shared-array allocation, for the scripts that run
kernels under it (``NUMBA_ENABLE_CUDASIM=1``).

The simulator runs each CUDA thread as a Python thread and makes a block's shared array
when the first of them reaches the ``cuda.shared.array`` line: it looks the line up in a
dict and stores a new array if none is there, with no lock. Two threads switched between
the look-up and the store each get an array of their own, and a kernel whose threads fill
one table together (dithering's level table) then reads half of it unset. Rare at
Python's 5 ms switch interval, frequent at the 50 us the scripts use to run faster. A real
GPU has no such race; this keeps the tests from seeing one.
"""
import sys
import threading

import numpy as np
from numba.core import types
from numba.cuda.simulator import kernelapi
from numba.np import numpy_support

_lock = threading.Lock()
_unpatched = kernelapi.FakeCUDAShared.array


def _array(self, shape, dtype):
    if shape == 0:  # dynamic shared memory: one buffer for all, nothing is made
        return _unpatched(self, shape, dtype)
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    caller = sys._getframe(1)
    site = (caller.f_code.co_filename, caller.f_lineno)  # the simulator's own key for an allocation
    with _lock:
        found = self._allocations.get(site)
        if found is None:
            found = self._allocations[site] = np.empty(shape, dtype)
    return found


def install() -> None:
    kernelapi.FakeCUDAShared.array = _array
