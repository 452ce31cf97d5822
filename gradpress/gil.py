"""How long a thread waiting for Python's GIL waits (``GRADPRESS_GIL_SWITCH_US``).

A worker runs three threads of Python at once: the training loop, the autograd engine's
thread that calls the gradient hooks, and the communication thread. A hook that has just
come back from a torch call (a copy, an event recorded) must take the GIL back; while the
communication thread runs Python, CPython makes the hook wait up to its switch interval,
5 ms, before it asks the running thread to let go. On a GPU each of those waits is time in
which the backward pass queues no kernels, so a worker may shorten the interval (the cost:
more handovers between threads that are both busy).
"""
from __future__ import annotations

import logging
import sys

from .config import Settings

log = logging.getLogger(__name__)


def configure(settings: Settings) -> None:
    """At a worker's start: set the switch interval the job asks for (0: leave Python's)."""
    if settings.gil_switch_us:
        sys.setswitchinterval(settings.gil_switch_us / 1e6)
        log.info("gradpress: GIL switch interval %d us (GRADPRESS_GIL_SWITCH_US)", settings.gil_switch_us)
