"""The worker's one deadline table: every wait the communication thread owns expires here.

``add`` returns the entry; whoever finishes the wait early cancels it, which drops the
callback at once. That matters: a push_pull's callback holds its partition, and through
it the gradient and the output, and the deadline is GRADPRESS_OP_TIMEOUT_S (300 s) away,
so an entry that kept them until then held every gradient of the last 5 minutes (measured:
a worker's memory grew by the model's size every step). Futures are held weakly for the
same reason. Cancelled entries leave the heap when they fall due, or all at once when they
are most of it. A heap keeps each pass of the loop O(due entries), whatever is outstanding.
"""
from __future__ import annotations

import heapq
import itertools
import weakref
from typing import Callable

from ..errors import OpTimeoutError
from .future import Future


class Deadline:
    __slots__ = ("on_expire",)

    def __init__(self, on_expire: Callable[[], None]):
        self.on_expire: Callable[[], None] | None = on_expire

    def cancel(self) -> None:
        self.on_expire = None


class Deadlines:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._cancelled = 0

    def __len__(self) -> int:
        """Entries still armed."""
        return len(self._heap) - self._cancelled

    def add(self, when: float, on_expire: Callable[[], None]) -> Deadline:
        entry = Deadline(on_expire)
        heapq.heappush(self._heap, (when, next(self._seq), entry))
        return entry

    def cancel(self, entry: Deadline) -> None:
        """The wait ended in time: forget its callback (and all it holds) now."""
        if entry.on_expire is None:
            return
        entry.cancel()
        self._cancelled += 1
        if self._cancelled > 1024 and 2 * self._cancelled > len(self._heap):
            self._heap = [item for item in self._heap if item[2].on_expire is not None]
            heapq.heapify(self._heap)
            self._cancelled = 0

    def add_future(self, when: float, future: Future, timeout_s: float) -> Deadline:
        """Fail ``future`` with OpTimeoutError at ``when`` unless it is done (or gone) by then."""
        ref = weakref.ref(future)

        def expire() -> None:
            f = ref()
            if f is not None and not f.done():
                f.fail(OpTimeoutError(f"{f.what}: no answer within {timeout_s:g} s (GRADPRESS_OP_TIMEOUT_S)"))
        return self.add(when, expire)

    def expire(self, now: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            entry = heapq.heappop(self._heap)[2]
            callback, entry.on_expire = entry.on_expire, None
            if callback is None:
                self._cancelled -= 1
            else:
                callback()
