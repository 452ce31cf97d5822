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

import logging
import os
import sys
import threading
from typing import Callable

from ..config import Settings
from ..errors import JobError, OpTimeoutError
from ..worker.abort import first_error_line, report_failure
from . import handles

log = logging.getLogger(__name__)
_installed = False
_uncaught = False  # an uncaught exception ends the process: its exit status is not 0 already
_lock = threading.Lock()


def install(current_client: Callable[[], object | None]) -> None:
    """Chain ``sys.excepthook`` once: report an uncaught exception before it is printed.

    Args:
        current_client: returns this process's ``WorkerClient`` (None once shut down).
    """
    global _installed
    note_raised_on(current_client)
    with _lock:
        if _installed:
            return
        _installed = True
    previous = sys.excepthook

    def report_then_print(exc_type, exc, tb) -> None:
        global _uncaught
        _uncaught = True
        client = current_client()
        if client is not None:  # Ctrl-C too: the others would wait for this worker's pushes
            try:
                client.abort("interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else first_error_line(exc))
            except Exception:  # noqa: BLE001 - the original error must still be printed
                pass
        previous(exc_type, exc, tb)

    sys.excepthook = report_then_print


def note_raised_on(current_client: Callable[[], object | None]) -> None:
    """The job's failure raised to the program by a push_pull's wait is kept on the client:
    the worker exits 1 even where the program went on and returned (``leave_at_exit``)."""
    def note(error: BaseException) -> None:
        client = current_client()
        if isinstance(error, JobError) and client is not None and client.raised is None:
            client.raised = error
    handles.on_raised = note


def report_init_failure(settings: Settings, error: BaseException, registered: bool = True) -> None:
    """``init()`` failed on this worker: tell the scheduler, so that the others stop too.
    ``registered=False``: the scheduler refused this worker, whose DMLC_WORKER_ID may be
    another worker's: it is named by its pid alone, not by that slot."""
    report_failure(settings, f"worker (pid {os.getpid()})", f"in init(): {first_error_line(error)}",
                   pid=os.getpid(), worker_id=settings.worker_id if registered else -1,
                   local_rank=settings.local_rank, launch=settings.launch_id,
                   wait_s=min(2.0, settings.heartbeat_timeout_s))


def rejoining(error: JobError, jobs_before: int) -> JobError | None:
    """``init()``'s deadline for a scheduler, in a process that was in a job before (it left
    it by ``shutdown()`` or ``suspend()``), said as what it is: that job ended, and this
    call joins a new one, whose processes did not all come. None where that is not the case
    (the error to raise, caused by ``error``, as ``raise ... from error`` makes it)."""
    if not jobs_before or not isinstance(error, OpTimeoutError):
        return None
    rejoined = OpTimeoutError(f"{error}; this process left its job before (shutdown() or suspend()): init() and "
                              f"resume() join a new job, whose scheduler, servers and other workers must all be "
                              f"started for it")
    rejoined.__cause__ = error
    return rejoined


def leave_at_exit(shutdown: Callable[[], None], current_client: Callable[[], object | None]) -> Callable[[], None]:
    """The exit handler of a worker that did not call ``shutdown()``: it leaves the job, and
    where the job failed (a lost node, the scheduler's word, this worker's communication
    ended by an error, a push_pull that raised one, caught or not: in another thread, say)
    the process exits 1. Python ignores what an exit handler raises and exits 0, so a failed
    job's worker (a pod, one worker per launcher) reported success. Its own deadline waiting
    for slower workers is a warning: their work may be legitimately longer (an evaluation on
    rank 0), and this worker's is done. (An explicit ``sys.exit(n)`` then exits 1, not n.)"""
    def leave() -> None:
        client = current_client()
        try:
            shutdown()
            failed = None if client is None or client.aborted else client.fatal or client.raised
        except OpTimeoutError as e:
            log.warning("leaving the job at exit: %s", e)
            return
        except JobError as e:
            failed = e
        if failed is None:
            return
        log.error("the job failed: %s", failed)
        if not _uncaught:  # (an uncaught exception already makes the status 1)
            _exit_now(1)
    return leave


def _exit_now(status: int) -> None:
    """``os._exit``: the only way to set the status from an exit handler. The handlers
    registered before gradpress's would not run, so the standard library's that matter run
    first: multiprocessing's (its children terminated or joined), ``weakref.finalize``'s
    (temporary directories removed), logging's and the standard streams' flushes."""
    import weakref
    cleanups = [getattr(sys.modules.get("multiprocessing.util"), "_exit_function", None),
                getattr(weakref.finalize, "_exitfunc", None), logging.shutdown, sys.stdout.flush, sys.stderr.flush]
    for cleanup in cleanups:
        try:
            if cleanup is not None:
                cleanup()
        except Exception:  # noqa: BLE001 - a broken pipe, say: the status matters more
            pass
    os._exit(status)
