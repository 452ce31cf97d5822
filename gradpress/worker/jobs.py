"""What the worker's communication thread works on: tensors, push_pull jobs, partition ops."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..compressors.spec import CodecSpec
from ..row_placement import RowLayout
from .future import Future

if TYPE_CHECKING:
    from .keys import WorkerKey


@dataclass
class Tensor:
    """A declared tensor: its id, its partitions (one ``WorkerKey`` each) and its compressor."""
    name: str
    count: int
    dtype: str
    tensor_id: int
    parts: list[int]
    servers: list[int]
    spec: CodecSpec | None = None        # None: uncompressed
    layout: RowLayout | None = None      # a row-sparse tensor: partition s is server s's hash share
    offsets: list[int] = field(init=False)
    keys: list["WorkerKey"] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.offsets = [int(o) for o in np.cumsum([0] + self.parts[:-1])]
        # Momentum(ErrorFeedback(codec)); its state is kept per partition key
        self.compressor = self.spec.build("worker") if self.spec else None
        # per share, the rows its server has published (sparse.py: replies may be bitmaps over them)
        self.known = [np.empty(0, self.layout.index_dtype) for _ in self.parts] if self.layout else []


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


@dataclass
class PartitionOp:
    """One partition of a push_pull on its way through the stages."""
    job: PushPull
    wkey: "WorkerKey"
    round: int = -1
    sent_us: float = 0.0
    acked: bool = False   # the server took the push: its credit is free again
    deadline: Any = None  # its entry in the deadline table, cancelled when it leaves flight

    @property
    def chunk(self) -> Any:
        return self.job.src[self.wkey.offset:self.wkey.offset + self.wkey.count]

    @property
    def destination(self) -> Any:
        return self.job.out[self.wkey.offset:self.wkey.offset + self.wkey.count]
