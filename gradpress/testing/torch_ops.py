"""How many torch ops a piece of code dispatches: on a GPU each is a launch and its Python
on the calling thread, so the benchmarks and tests count them where a host cannot time them."""
from __future__ import annotations

from typing import Callable

from torch.utils._python_dispatch import TorchDispatchMode


class OpCounter(TorchDispatchMode):
    """Counts the torch ops dispatched inside it that are not views (each launches work; a
    multi-tensor op counts once, as a GPU launches it)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


def ops_of(fn: Callable[[], object]) -> int:
    """The ops ``fn()`` dispatches that are not views."""
    with OpCounter() as ops:
        fn()
    return ops.count
