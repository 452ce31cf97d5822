"""What the worker's communication thread works on: push_pull jobs and their partition ops."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..compressors.arrays import is_device_array
from .future import Future
from .keys import Tensor, WorkerKey


@dataclass
class PushPull:
    """One push_pull of a whole tensor: src is pushed, the aggregate lands in out."""
    tensor: Tensor
    src: Any                 # 1-D numpy array, or a torch CUDA tensor for GPU compression
    out: Any
    divisor: int
    future: Future
    remaining: int
    lr: float | None = None
    # waited for before src is read: a CUDA event after the asynchronous copy that fills src
    # (the caller never blocks on it; the host-copies thread waits for it, ``filling``)
    ready: Any = None
    # payloads of its partitions compressed together with the first one sent (stages.py,
    # ``compress_tensor``), by key: (round, payload or the ValueError of a refused step);
    # {} once the first partition is sent without
    compressed: dict | None = None

    def early_payload(self, wk: WorkerKey, round: int) -> Any:
        """The payload made early for ``wk``'s ``round`` (None: none), taken; raises the
        ValueError of its refused step."""
        early = self.compressed.pop(wk.key, None) if self.compressed else None
        if wk.compressed_by is self:  # marked for this job's payloads (flight.py): they are taken, or never came
            wk.compressed_by = None
        if early is None:
            return None
        made_for, payload = early
        if made_for != round:  # the flight's held ops rule this out
            raise RuntimeError(f"key {wk.key}: payload made for round {made_for}, sent in round {round}")
        if isinstance(payload, ValueError):
            raise payload
        return payload

    def filling(self) -> object | None:
        """The event of the asynchronous copy still filling the host source (a CUDA tensor
        staged through pinned memory, ``torch/staging.py``), or None: there is none, it is
        done, or the source is on the device (its wait is queued there, ``await_source``)."""
        if (ready := self.ready) is None or is_device_array(self.src) or not hasattr(ready, "query"):
            return None
        from ..kernels.cuda import streams
        with streams.on_event_device(ready):  # (none selected here: CUDA would make a context on GPU 0)
            return None if ready.query() else ready


@dataclass
class PartitionOp:
    """One partition of a push_pull on its way through the stages."""
    job: PushPull
    wkey: WorkerKey
    round: int = -1
    sent_us: float = 0.0
    acked: bool = False   # the server took the push: its credit is free again
    deadline: Any = None  # its entry in the deadline table, cancelled when it leaves flight
    summed: Any = None    # the machine's sum, pushed instead of our own partition (worker/relay.py)
    stalled: str = ""     # who its server says the round waits for (Op.STALLED), for its deadline's error

    @property
    def chunk(self) -> Any:
        if self.summed is not None:
            return self.summed
        return self.job.src[self.wkey.offset:self.wkey.offset + self.wkey.count]

    @property
    def destination(self) -> Any:
        return self.job.out[self.wkey.offset:self.wkey.offset + self.wkey.count]
