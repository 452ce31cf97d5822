"""A worker whose training code fails stops the whole job in seconds, naming itself.

Without this, a Python exception in one worker runs the interpreter's exit path:
``shutdown()`` waits for every worker to finish while the others wait for this
worker's pushes, and the job stalls until GRADPRESS_OP_TIMEOUT_S. Here an uncaught
exception (a Ctrl-C's ``KeyboardInterrupt`` too) is first reported to the scheduler
(ABORT with its first error line), which
tells every other node which worker failed and why; then the exception is printed as
usual and the process exits without waiting for anyone. ``init()`` reports its own
failures the same way, over a socket of its own, since it may not have registered.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Callable

from ..config import Settings
from ..worker.abort import first_error_line, report_failure

_installed = False
_lock = threading.Lock()


def install(current_client: Callable[[], object | None]) -> None:
    """Chain ``sys.excepthook`` once: report an uncaught exception before it is printed.

    Args:
        current_client: returns this process's ``WorkerClient`` (None once shut down).
    """
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    previous = sys.excepthook

    def report_then_print(exc_type, exc, tb) -> None:
        client = current_client()
        if client is not None:  # Ctrl-C too: the others would wait for this worker's pushes
            try:
                client.abort("interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else first_error_line(exc))
            except Exception:  # noqa: BLE001 - the original error must still be printed
                pass
        previous(exc_type, exc, tb)

    sys.excepthook = report_then_print


def report_init_failure(settings: Settings, error: BaseException, registered: bool = True) -> None:
    """``init()`` failed on this worker: tell the scheduler, so that the others stop too.
    ``registered=False``: the scheduler refused this worker, whose DMLC_WORKER_ID may be
    another worker's: it is named by its pid alone, not by that slot."""
    report_failure(settings, f"worker (pid {os.getpid()})", f"in init(): {first_error_line(error)}",
                   pid=os.getpid(), worker_id=settings.worker_id if registered else -1,
                   local_rank=settings.local_rank,
                   wait_s=min(2.0, settings.heartbeat_timeout_s))
