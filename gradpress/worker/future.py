"""A result that one thread sets and another waits for, with a deadline."""
from __future__ import annotations

import threading
from typing import Any

from ..errors import OpTimeoutError


class Future:
    def __init__(self, what: str):
        self.what = what
        self._event = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        # a push_pull into a CUDA tensor: the torch event after its last copy or kernel on
        # gradpress's stream, which the consumer's stream waits for (None: nothing to wait for)
        self.device_event: Any = None

    def set(self, value: Any = None) -> None:
        if not self._event.is_set():
            self._value = value
            self._event.set()

    def fail(self, error: BaseException) -> None:
        if not self._event.is_set():
            self._error = error
            self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def result(self, timeout_s: float) -> Any:
        """The value; raises the failure, or OpTimeoutError after ``timeout_s`` seconds."""
        if not self._event.wait(timeout_s):
            raise OpTimeoutError(f"{self.what}: no result within {timeout_s:g} s (GRADPRESS_OP_TIMEOUT_S)")
        if self._error is not None:
            raise self._error
        return self._value
