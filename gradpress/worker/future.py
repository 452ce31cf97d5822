"""A result that one thread sets and another waits for, with a deadline."""
from __future__ import annotations

import threading
from typing import Any

from ..errors import OpTimeoutError


class Future:
    """Set once (``set`` or ``fail``); waited for by any number of threads.

    A lock held from creation until the result is in, rather than a ``threading.Event``: the
    communication thread sets one per push_pull, and an Event's set goes through a
    Condition written in Python (a lock taken, the waiters' list walked and emptied), about
    10% of that thread's samples in a job of many small tensors; a lock's release is one C
    call, and the first waiter releases it again for the next."""

    def __init__(self, what: str):
        self.what = what
        self._pending = threading.Lock()
        self._pending.acquire()  # released once the result is in
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None
        # a push_pull into a CUDA tensor: the torch event after its last copy or kernel on
        # gradpress's stream, which the consumer's stream waits for (None: nothing to wait for)
        self.device_event: Any = None

    def set(self, value: Any = None) -> None:
        if not self._done:
            self._value = value
            self._finish()

    def fail(self, error: BaseException) -> None:
        if not self._done:
            self._error = error
            self._finish()

    def _finish(self) -> None:
        self._done = True
        try:
            self._pending.release()
        except RuntimeError:  # set by two threads at once: the first one's release stands
            pass

    def done(self) -> bool:
        return self._done

    def result(self, timeout_s: float) -> Any:
        """The value; raises the failure, or OpTimeoutError after ``timeout_s`` seconds."""
        if not self._done:
            if not self._pending.acquire(timeout=max(timeout_s, 0)):
                raise OpTimeoutError(f"{self.what}: no result within {timeout_s:g} s (GRADPRESS_OP_TIMEOUT_S)")
            try:
                self._pending.release()  # for the next waiter
            except RuntimeError:  # released meanwhile by a second, concurrent set
                pass
        if self._error is not None:
            raise self._error
        return self._value
