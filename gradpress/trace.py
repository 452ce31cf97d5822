"""Chrome-trace / Perfetto JSON of each partition's stages (``GRADPRESS_TRACE=path``).

Workers record compress, push-to-reply (network plus server) and decompress;
servers record each push's sum and the compression of the aggregate. Every
process writes its own file, ``path`` with its role and rank inserted before the
extension, when it ends. Open one or several in https://ui.perfetto.dev or
chrome://tracing.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from contextlib import contextmanager

log = logging.getLogger(__name__)
_EPOCH = time.perf_counter()


def now_us() -> float:
    return (time.perf_counter() - _EPOCH) * 1e6


class Tracer:
    """Collects complete ("X") events; disabled (and free) without a path."""

    def __init__(self, path: str):
        self.path = path
        self.enabled = bool(path)
        self.events: list[dict] = []

    def add(self, name: str, start_us: float, end_us: float, **args) -> None:
        if self.enabled:
            self.events.append({"name": name, "ph": "X", "ts": start_us, "dur": max(end_us - start_us, 0.01),
                                "pid": os.getpid(), "tid": threading.current_thread().name, "args": args})

    @contextmanager
    def span(self, name: str, **args):
        if not self.enabled:
            yield
            return
        start = now_us()
        try:
            yield
        finally:
            self.add(name, start, now_us(), **args)

    def write(self, process: str) -> str | None:
        """Write the events to this process's file; returns its path, or None (logged) where
        it cannot be written: a trace is a diagnostic, and the job it traced has finished."""
        if not self.enabled:
            return None
        stem, ext = os.path.splitext(self.path)
        path = f"{stem}-{process.replace(' ', '')}{ext or '.json'}"
        meta = [{"name": "process_name", "ph": "M", "pid": os.getpid(), "args": {"name": process}}]
        try:
            # a folder named in GRADPRESS_TRACE that does not exist yet is made
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w") as fh:
                json.dump({"traceEvents": meta + self.events, "displayTimeUnit": "ms"}, fh)
        except OSError as e:
            log.error("gradpress: GRADPRESS_TRACE: could not write %s's trace to %s: %s", process, path, e)
            return None
        return path
