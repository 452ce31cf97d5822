"""Where a key's aggregate goes once its round is complete, and what each pull's reply carries.

``KeyState`` (store.py) owns the rules of the rounds and sums into an accumulator; a
result sink owns the memory that sum lands in and builds the replies that carry it:

- :class:`FrameSink`: the aggregate travels in PULL_REPLY frames (compressed keys too:
  their aggregate arrives already compressed, as header fields and buffers).
- :class:`SharedSlots`: the aggregate stays in one of two slots of a shared-memory
  region; co-located workers read it in place and their reply only names the slot.

A sink also hands out each round's accumulator. That is what keeps shared memory
zero-copy: an uncompressed fp32 (or fp64) key sums straight into the slot its
workers will read, so completing a round moves no bytes.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import numpy as np

from ..kernels.cpu import server_sum as kernels
from ..net.protocol import Op
from ..net.shm import Region


class Reply(NamedTuple):
    """A message for the engine to send to the worker whose identity is ``to``."""
    to: bytes
    op: Op
    fields: dict[str, Any]
    buffers: list[Any]


def sum_dtype(dtype: str) -> np.dtype:
    """The accumulator's dtype: fp16 and fp32 sum in fp32; fp64 keeps its precision."""
    return np.dtype(np.float64 if dtype == "float64" else np.float32)


class ResultSink(ABC):
    """What every sink does; subclasses decide where the aggregate lives."""

    def __init__(self, key: int, count: int, dtype: str):
        self.key, self.count, self.dtype = key, count, dtype

    @abstractmethod
    def accumulator(self, rnd: int) -> np.ndarray:
        """The buffer round ``rnd`` sums into (zeroed before any round completes)."""

    @abstractmethod
    def publish(self, rnd: int, acc: np.ndarray) -> None:
        """Round ``rnd`` is complete and ``acc`` holds its sum; later pulls read it."""

    def publish_compressed(self, rnd: int, fields: dict, buffers: list) -> None:
        """Round ``rnd`` is complete and was compressed into codec header ``fields`` and ``buffers``."""
        raise TypeError(f"key {self.key}: a {type(self).__name__} holds uncompressed results only")

    @abstractmethod
    def reply(self, to: bytes, rnd: int) -> Reply:
        """The PULL_REPLY that gives worker ``to`` the last published aggregate (round ``rnd``)."""

    def snapshot(self, to: bytes, rnd: int, acc: np.ndarray) -> Reply:
        """Async mode: the store as it is now, copied so that later pushes cannot change it."""
        values = kernels.to_half(acc) if self.dtype == "float16" else acc.copy()
        return Reply(to, Op.PULL_REPLY, self.fields(rnd), [values])

    def fields(self, rnd: int) -> dict[str, Any]:
        """A PULL_REPLY's header fields of round ``rnd`` (a reply of no data: store.py)."""
        return {"key": self.key, "round": rnd, "dtype": self.dtype, "count": self.count}


class FrameSink(ResultSink):
    """Results that travel in frames: raw values in the wire dtype, or a compressed payload.

    Two buffers alternate by round, as :class:`SharedSlots` do, and for the same reason
    they suffice: a worker pushes round r + 2 only after it received round r + 1, which
    completed only once every worker had pushed it, so after every worker received round
    r. Round r + 2 never sums over a reply of round r still on its way, and no round
    asks for fresh memory (on these VMs, first touching pages costs more than the sum).
    """

    def __init__(self, key: int, count: int, dtype: str):
        super().__init__(key, count, dtype)
        self._accs = [np.zeros(count, sum_dtype(dtype)) for _ in (0, 1)]
        # fp16 sums in fp32 in one accumulator and is rounded into alternating results
        self._halves = [np.zeros(count, np.float16) for _ in (0, 1)] if dtype == "float16" else None
        self._values: np.ndarray | None = None
        self._compressed: tuple[dict, list] | None = None

    def accumulator(self, rnd: int) -> np.ndarray:
        return self._accs[0 if self._halves is not None else rnd % 2]

    def publish(self, rnd: int, acc: np.ndarray) -> None:
        self._compressed = None
        if self._halves is not None:
            self._values = kernels.to_half(acc, self._halves[rnd % 2])
        else:
            self._values = acc  # the accumulator is the result: no copy

    def publish_compressed(self, rnd: int, fields: dict, buffers: list) -> None:
        self._values, self._compressed = None, (fields, buffers)

    def reply(self, to: bytes, rnd: int) -> Reply:
        if self._compressed is not None:
            fields, buffers = self._compressed
            return Reply(to, Op.PULL_REPLY, dict(self.fields(rnd), **fields), buffers)
        return Reply(to, Op.PULL_REPLY, self.fields(rnd), [self._values])


class SharedSlots(ResultSink):
    """Results in two slots of a shared-memory segment, alternating by round.

    Workers keep one round of a key in flight, so round r + 2 completes only after
    every worker has read round r: its slot is free again by then. Workers named in
    ``readers`` share this host and read the slot in place; any other worker gets the
    slot's bytes in a frame.
    """

    def __init__(self, key: int, count: int, dtype: str, region: Region, dma: bool = False):
        super().__init__(key, count, dtype)
        self.dma = dma  # in a chunk whose pages are never punched: readers may register it for DMA
        nbytes = count * np.dtype(dtype).itemsize
        if region.nbytes < 2 * nbytes:
            raise ValueError(f"key {key}: a shared region of {region.nbytes} bytes; two slots need {2 * nbytes}")
        self.region = region
        self._ref = region.ref
        self.slots = [region.array(dtype, count, i * nbytes) for i in (0, 1)]
        self.readers: set[bytes] = set()
        # fp16 sums in fp32 here and is rounded into its slot once, when the round completes
        self._private = np.zeros(count, np.float32) if dtype == "float16" else None
        self._slot = 0

    def accumulator(self, rnd: int) -> np.ndarray:
        return self._private if self._private is not None else self.slots[rnd % 2]

    def publish(self, rnd: int, acc: np.ndarray) -> None:
        self._slot = rnd % 2
        slot = self.slots[self._slot]
        if self._private is not None:
            kernels.to_half(acc, slot)
        elif acc is not slot:  # summed somewhere else than accumulator() offered: one copy
            slot[:] = acc

    def reply(self, to: bytes, rnd: int) -> Reply:
        if to in self.readers:
            fields = dict(self.fields(rnd), shm=self._ref, slot=self._slot)
            if self.dma:
                fields["dma"] = True
            return Reply(to, Op.PULL_REPLY, fields, [])
        return Reply(to, Op.PULL_REPLY, self.fields(rnd), [self.slots[self._slot]])
