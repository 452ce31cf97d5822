"""Reporting a failed worker to the scheduler, so that the job stops in seconds.

A worker whose training code raises sends ABORT over its own scheduler link
(``WorkerClient.abort``). This module covers the two cases where that link does not
exist: a worker that fails inside ``init()`` before it registered, and a launcher that
saw its worker process exit with a non-zero code (``os._exit``, a signal). Both send
ABORT from a short-lived socket of their own, naming the worker by pid, DMLC_WORKER_ID
and local rank, and wait briefly for the scheduler's acknowledgement.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import traceback
import uuid

import zmq

from ..config import Settings
from ..errors import JobError
from ..net import transport
from ..net.protocol import MAX_REASON_CHARS, Op

log = logging.getLogger(__name__)



def first_error_line(error: BaseException) -> str:
    """``"ValueError: boom"``: the exception's type and the first line of its message."""
    lines = traceback.format_exception_only(type(error), error)
    text = lines[-1].strip() if lines else type(error).__name__
    return text.splitlines()[0][:MAX_REASON_CHARS] if text else type(error).__name__


def report_failure(settings: Settings, sender: str, reason: str, pid: int, worker_id: int, local_rank: int,
                   wait_s: float = 2.0, role: str = "worker", launch: str = "") -> bool:
    """Send ABORT for the worker (pid, worker_id, local_rank), or the server (``role``, pid),
    to the scheduler; ``sender`` names who reports it in the scheduler's log (``"launcher"``,
    ``"worker (pid 12)"``); ``launch``: the GRADPRESS_LAUNCH_ID its launcher gave it.

    Returns:
        True once the scheduler acknowledged it within ``wait_s``; False if it did not
        answer (gone already, or never reachable): the heartbeat timeout then applies.
    """
    try:
        sock = transport.dealer(transport.context(), settings, settings.root_uri, settings.root_port,
                                f"abort-{uuid.uuid4().hex[:12]}".encode())
    except ValueError:  # no usable job secret: this process could never reach the scheduler
        return False
    try:
        transport.send(sock, Op.ABORT, sender, reason=reason[:MAX_REASON_CHARS], pid=pid, worker_id=worker_id,
                       local_rank=local_rank, **({"role": role} if role != "worker" else {}),
                       **({"launch": launch} if launch else {}))
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            if not sock.poll(left * 1000):
                return False
            _, header, _ = transport.recv(sock, routed=False)
            if header is not None and header["op"] in (Op.SHUTDOWN, Op.ERROR):
                return True
        return False
    except zmq.ZMQError:
        return False
    finally:
        sock.close()


def exit_later(grace_s: float, error: JobError) -> None:
    """Stop the process if the training code has not stopped by itself within ``grace_s``.

    The error is raised at the next gradpress call; this catches a training loop that is
    busy elsewhere (or swallowed the error), so a lost peer never leaves a process behind.
    """
    def stop() -> None:
        time.sleep(grace_s)
        log.critical("exiting: %s", error)
        logging.shutdown()
        os._exit(1)
    threading.Thread(target=stop, name="gp-exit-watchdog", daemon=True).start()
