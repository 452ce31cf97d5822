"""The worker's one deadline table: every wait the communication thread owns expires here.

Entries are never removed by hand: when one falls due, its callback decides whether
the thing it guards is still waiting (a future not yet done, an op still in flight).
A heap keeps each pass of the loop O(due entries), whatever is outstanding.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Callable

from ..errors import OpTimeoutError
from .future import Future


class Deadlines:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def add(self, when: float, on_expire: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), on_expire))

    def add_future(self, when: float, future: Future, timeout_s: float) -> None:
        """Fail ``future`` with OpTimeoutError at ``when`` unless it is done by then."""
        def expire() -> None:
            if not future.done():
                future.fail(OpTimeoutError(f"{future.what}: no answer within {timeout_s:g} s "
                                           f"(GRADPRESS_OP_TIMEOUT_S)"))
        self.add(when, expire)

    def expire(self, now: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            heapq.heappop(self._heap)[2]()
