"""Two races of numba's CUDA simulator, and one limit, closed for the scripts that run kernels
under it (``NUMBA_ENABLE_CUDASIM=1``). A real GPU has none of them; this keeps the tests from
seeing them.

The simulator runs each CUDA thread as a Python thread, and Python may switch between
them between any two bytecodes, which leaves both open (a script that switches faster than
Python's 5 ms makes them frequent):

- **Shared arrays.** A block's shared array is made when the first of its threads reaches
  the ``cuda.shared.array`` line: the simulator looks the line up in a dict and stores a
  new array if none is there, with no lock. Two threads switched between the look-up and
  the store each get an array of their own, and a kernel whose threads fill one table
  together (dithering's level table) then reads half of it unset.
- **Device-function globals.** Each call of a device function lists its module's globals
  (to swap in the fake ``cuda`` module) by iterating the dict in Python. A thread whose
  arithmetic warns for the first time in that module (the uint64 wrap of kernels/rng.py,
  intended) makes Python add ``__warningregistry__`` to those globals, and a thread then
  iterating them fails with "dictionary changed size during iteration". The patched swap
  takes its snapshot with one ``dict()`` copy, which no other thread can interleave.
- **One kernel at a time.** The simulator keeps the running kernel in one module global and
  asserts that no other is running ("concurrent simulated kernel not supported"). A worker
  launches from two threads (encoders on the host-copies thread, decoders as results land on
  the communication thread), as a GPU runs kernels of two streams at once; here the launches
  take turns instead.
"""
import sys
import threading
from contextlib import contextmanager

import numpy as np
from numba.core import types
from numba.cuda.simulator import kernel, kernelapi
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


_one_kernel = threading.Lock()
_unpatched_context = kernel._push_kernel_context


@contextmanager
def _kernel_context_in_turn(mod):
    with _one_kernel, _unpatched_context(mod):
        yield


@contextmanager
def _swapped_cuda_module(fn, fake_cuda_module):
    from numba import cuda

    names = fn.__globals__
    original = {k: v for k, v in dict(names).items() if v is cuda}  # dict(): one copy under the GIL
    names.update(dict.fromkeys(original, fake_cuda_module))
    try:
        yield
    finally:
        names.update(original)


def install() -> None:
    """Before any kernel runs."""
    # a numba that moved either name would leave its race open without a word: say so instead
    assert hasattr(kernelapi.FakeCUDAShared, "array") and hasattr(kernel, "swapped_cuda_module") and \
        hasattr(kernel, "_push_kernel_context"), "numba's CUDA simulator changed: tests/support/cudasim_races.py " \
        "patches nothing"
    kernelapi.FakeCUDAShared.array = _array
    kernel.swapped_cuda_module = _swapped_cuda_module  # the name kernel.py's launches call
    kernel._push_kernel_context = _kernel_context_in_turn  # (the same)
