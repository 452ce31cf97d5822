"""A node's exit without Python's final garbage collections (``GRADPRESS_EXIT_SKIP_GC``).

As the interpreter exits it clears every module and runs full collections over every
object still tracked. A torch worker holds hundreds of thousands: torch, the compiler
stack that ``torch.optim`` imports (dynamo, sympy) and numba's typing tables. Walking them
cost about 0.9 CPU-seconds per worker process here, over a quarter of a short job's worker
(``benchmarks/node_exit.py``). gradpress needs none of it: its shutdown closes its own
sockets and shared memory. So, after that shutdown, the collector is frozen
(``gc.freeze``); what is still alive is freed by reference counting as the modules are
cleared, and the rest by the OS.

The price: an object that only a reference cycle keeps alive at exit is not finalized (its
``__del__`` does not run), which Python does not promise at exit in any case. A script that
needs it sets ``GRADPRESS_EXIT_SKIP_GC=0``.
"""
from __future__ import annotations

import atexit
import gc
from typing import Callable

from .config import Settings

_registered = False


def configure(settings: Settings, shutdown: Callable[[], None] | None = None) -> None:
    """At a node's start: at exit, ``shutdown`` (where given) runs, then the collector is
    frozen (handlers run last registered first, so the freeze is registered first)."""
    global _registered
    if settings.exit_skip_gc and not _registered:
        atexit.register(gc.freeze)
        _registered = True
    if shutdown is not None:
        atexit.register(shutdown)
