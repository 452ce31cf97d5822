"""One key's state on a server and the rules of its rounds (no sockets here).

Sync mode, per key: the first push of round r is stored into the accumulator,
later ones are added; once all workers have pushed, round r is complete, its
result is kept as the reply and every pull waiting for r is answered. A pull that
arrives early waits; a push for round r+1 that arrives before r completes is
held aside and applied after, so rounds never mix. Async mode: a push is added
into the store at once and a pull reads the store as it is.

Methods return the replies to send as ``Reply`` tuples; the engine sends them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..protocol import Op
from . import kernels


class Reply(NamedTuple):
    to: bytes
    op: Op
    fields: dict[str, Any]
    buffers: list[Any]


class PushError(ValueError):
    """A push or pull this key cannot accept; the message names why."""


@dataclass
class KeyState:
    key: int
    name: str
    count: int
    dtype: str
    num_workers: int
    async_mode: bool = False
    round: int = 0                          # the round being accumulated
    pushed: set = field(default_factory=set)
    early: dict = field(default_factory=dict)   # sender -> (round, array) of round + 1
    waiting: list = field(default_factory=list)  # senders whose pull waits for `round`
    done_round: int = -1                    # last completed round
    result: np.ndarray | None = None        # its aggregate, in the wire dtype
    shm_peers: set = field(default_factory=set)  # workers that read results from shared memory
    shm_name: str = ""                      # the segment holding the two result slots
    slots: list | None = None
    result_slot: int = 0

    def __post_init__(self) -> None:
        # fp16/fp32 sum in fp32; fp64 keeps its precision
        self.acc_dtype = np.float64 if self.dtype == "float64" else np.float32
        self.acc = np.zeros(self.count, self.acc_dtype)

    def share_results(self, name: str, slots: list[np.ndarray]) -> None:
        """Keep results in two shared slots, alternating by round.

        Workers keep one round of a key in flight, so round r + 2 completes only after
        every worker has read round r: its slot is free again by then.
        """
        self.shm_name, self.slots = name, slots
        if self.dtype != "float16":  # accumulate straight into the slot; no copy at the end
            slot = self.slots[self.round % 2]
            if self.pushed:
                slot[:] = self.acc
            self.acc = slot

    def describe(self) -> str:
        return f"key {self.key} (tensor {self.name!r})"

    def check_init(self, name: str, count: int, dtype: str) -> None:
        if (name, count, dtype) != (self.name, self.count, self.dtype):
            raise PushError(f"{self.describe()}: INIT_KEY for {name!r} with {count} {dtype} elements; "
                            f"the key holds {self.count} {self.dtype} elements of {self.name!r}")

    def decode(self, header: dict, frames: list) -> np.ndarray:
        """The pushed values as an array, after checking they fit this key."""
        if header["dtype"] != self.dtype or header["count"] != self.count:
            raise PushError(f"{self.describe()}: push of {header['count']} {header['dtype']} elements; "
                            f"the key holds {self.count} {self.dtype}")
        if len(frames) != 1:
            raise PushError(f"{self.describe()}: push has {len(frames)} data frames, expected 1")
        buf = frames[0].buffer if hasattr(frames[0], "buffer") else frames[0]
        expected = self.count * np.dtype(self.dtype).itemsize
        if len(buf) != expected:
            raise PushError(f"{self.describe()}: push carries {len(buf)} bytes, expected {expected}")
        return np.frombuffer(buf, dtype=self.dtype)

    def push(self, sender: bytes, rnd: int, values: np.ndarray) -> list[Reply]:
        if self.async_mode:
            kernels.accumulate(self.acc, values, first=False)
            return []
        if rnd == self.round:
            if sender in self.pushed:
                raise PushError(f"{self.describe()}: second push of round {rnd} from the same worker")
            kernels.accumulate(self.acc, values, first=not self.pushed)
            self.pushed.add(sender)
            return self._complete() if len(self.pushed) == self.num_workers else []
        if rnd == self.round + 1:
            if sender in self.early:
                raise PushError(f"{self.describe()}: a third round in flight from one worker (round {rnd})")
            # the frame's memory may be reused by ZeroMQ only after we drop it; copy to be safe
            self.early[sender] = values.copy()
            return []
        raise PushError(f"{self.describe()}: push for round {rnd}, but the key is at round {self.round}")

    def pull(self, sender: bytes, rnd: int) -> list[Reply]:
        if self.async_mode:
            return [self._reply(sender, rnd, self._wire(self.acc))]
        if rnd == self.done_round:
            return [self._reply(sender, rnd, self.result)]
        if rnd == self.round:
            self.waiting.append(sender)
            return []
        raise PushError(f"{self.describe()}: pull for round {rnd}; the key completed round "
                        f"{self.done_round} and is accumulating round {self.round}")

    def _complete(self) -> list[Reply]:
        if self.slots is not None:
            self.result_slot = self.round % 2
            if self.dtype == "float16":
                self.result = kernels.to_half(self.acc, self.slots[self.result_slot])
            else:
                self.result, self.acc = self.acc, self.slots[1 - self.result_slot]
        else:
            # the accumulator becomes the result, so a reply still in flight is never overwritten
            self.result = self._wire(self.acc)
            self.acc = np.empty(self.count, self.acc_dtype) if self.result is self.acc else self.acc
        self.done_round, self.round = self.round, self.round + 1
        self.pushed = set()
        replies = [self._reply(s, self.done_round, self.result) for s in self.waiting]
        self.waiting = []
        early, self.early = self.early, {}
        for sender, values in early.items():
            replies += self.push(sender, self.round, values)
        return replies

    def _wire(self, acc: np.ndarray) -> np.ndarray:
        if self.dtype == "float16":
            return kernels.to_half(acc)
        return acc if self.async_mode is False else acc.copy()

    def _reply(self, to: bytes, rnd: int, values: np.ndarray) -> Reply:
        fields = {"key": self.key, "round": rnd, "dtype": self.dtype, "count": self.count}
        if to in self.shm_peers and values is self.result:
            return Reply(to, Op.PULL_REPLY, dict(fields, shm=self.shm_name, slot=self.result_slot), [])
        return Reply(to, Op.PULL_REPLY, fields, [values])
