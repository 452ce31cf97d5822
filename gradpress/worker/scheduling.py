"""Which partition goes next: highest priority first, limited by credit.

As in ByteScheduler, the parameters the next forward pass needs first get the
highest priority, and only ``credit`` pushes are on the wire at once, so an
urgent partition never queues behind a long backlog. A push's credit returns when
the server acknowledges it, not when its round completes: rounds wait for every
worker, and workers whose hooks fire in different orders would otherwise each hold
their credit for rounds only the other can complete.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Any


class CreditQueue:
    def __init__(self, credit: int):
        self.credit = credit
        self.in_flight = 0
        self._heap: list[tuple[int, int, Any]] = []
        self._seq = itertools.count()

    def put(self, item: Any, priority: int) -> None:
        """Larger priority goes first; equal priorities go in arrival order."""
        heapq.heappush(self._heap, (-priority, next(self._seq), item))

    def take(self) -> Any | None:
        """The next item if credit allows (counting it as in flight), else None."""
        if self.in_flight >= self.credit or not self._heap:
            return None
        self.in_flight += 1
        return heapq.heappop(self._heap)[2]

    def release(self) -> None:
        self.in_flight -= 1

    def drain(self) -> list[Any]:
        """Every item not taken yet, taken now whatever the credit (the job ended)."""
        items, self._heap = [item for _, _, item in sorted(self._heap)], []
        return items

    def waiting(self) -> list[Any]:
        """The items not taken yet."""
        return [item for _, _, item in self._heap]
