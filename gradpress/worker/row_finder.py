"""Finding a GPU gradient's rows off the threads that must not wait for the device.

A row-sparse push_pull starts from the rows (``SparseRows``), and on a GPU those are known
only once the device has made the gradient: finding a dense gradient's non-zero rows waits
for the device twice (the count of rows, then the rows), and a sparse COO gradient's
indices once. The backward pass's thread, which hands the gradient over, must not wait (it
would stop queueing the kernels of the layers still to come, as BytePS never blocks it),
nor the communication thread (it would stop pushing and landing other partitions). So the
finding runs on a thread of this module's, in the order gradients were handed over, and
the push_pull then starts from there as any other.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

log = logging.getLogger(__name__)


class RowFinder:
    def __init__(self) -> None:
        self._queued: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._unfinished = 0  # submitted, not done yet

    def submit(self, find_then_start: Callable[[], None]) -> None:
        """Run ``find_then_start`` on the finder's thread, after those submitted before. It
        reports its own errors (to the future of its push_pull); an error it lets out is
        its caller's bug, and the thread goes on with the next."""
        with self._lock:  # hooks of several devices' backward threads may submit at once
            if self._thread is None:  # a worker without GPU row-sparse tensors never starts it
                self._thread = threading.Thread(target=self._run, name="gp-row-finder", daemon=True)
                self._thread.start()
            self._unfinished += 1
        self._queued.put(find_then_start)

    def busy(self) -> bool:
        """Whether push_pulls submitted here have not all started yet."""
        return self._unfinished > 0

    def _run(self) -> None:
        while (work := self._queued.get()) is not None:
            try:
                work()
            except Exception:  # noqa: BLE001 - logged; the push_pulls after it still start
                log.exception("gradpress: a row-sparse push_pull could not start")
            with self._lock:
                self._unfinished -= 1

    def close(self) -> None:
        """Let the thread end once the work submitted so far is done."""
        self._queued.put(None)
