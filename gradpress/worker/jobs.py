"""What the worker's communication thread works on: push_pull jobs and their partition ops."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    # waited for (its ``synchronize()``) on the communication thread before src is read: a
    # CUDA event after the asynchronous copy that fills src (the caller never blocks on it)
    ready: Any = None


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

    @property
    def chunk(self) -> Any:
        if self.summed is not None:
            return self.summed
        return self.job.src[self.wkey.offset:self.wkey.offset + self.wkey.count]

    @property
    def destination(self) -> Any:
        return self.job.out[self.wkey.offset:self.wkey.offset + self.wkey.count]
