"""What the CUDA simulator's scripts launch, kept for compiling for a real GPU.

The simulator runs a kernel's Python without typing it, so a kernel numba's CUDA compiler
refuses (a type it cannot unify, a call it cannot lower) passes every simulator case and
fails only on a GPU. ``record()``, installed in a simulator script, notes each kernel
launch's argument types (numba's own ``typeof`` of what was passed, as the real dispatcher
types it); ``ptx_check.py`` compiles each kernel for those types without a GPU.
"""
from __future__ import annotations

import atexit
import os
import pickle

ENV = "GP_KERNEL_SIGNATURES"  # where a script appends what it launched


def _type_of(arg):
    import numba
    array = getattr(arg, "_ary", None)  # a simulated device array wraps a numpy one
    return numba.typeof(array if array is not None else arg)


def record() -> None:
    """Note every launch of this process (where ``GP_KERNEL_SIGNATURES`` names a file);
    written when the process exits."""
    path = os.environ.get(ENV)
    if not path:
        return
    from numba.cuda.simulator import kernel as simulated
    seen: set = set()
    launch = simulated.FakeCUDAKernel.__call__

    def noted(self, *args):
        if not self._device:
            seen.add((self.fn.__module__, self.fn.__qualname__, tuple(_type_of(a) for a in args)))
        return launch(self, *args)

    simulated.FakeCUDAKernel.__call__ = noted

    def save() -> None:
        with open(path, "ab") as fh:
            pickle.dump(sorted(seen, key=str), fh)
    atexit.register(save)
