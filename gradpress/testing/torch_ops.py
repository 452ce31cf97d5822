"""What a piece of torch code costs: the ops it dispatches (on a GPU each is a launch and its
Python on the calling thread, so the benchmarks and tests count them where a host cannot
time them) and its median time, to the device's end of each call."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

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


def median_ms(fn: Callable[[], object], reps: int) -> float:
    """Median milliseconds of ``reps`` calls of ``fn`` after one untimed call (compiles, first
    touches); on a GPU each call timed to the end of its device work."""
    def sync() -> None:
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
    fn()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)
