"""What the worker's communication thread tracks: tensors, push_pull jobs, partition ops."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..compressors import build_compressor
from .future import Future


@dataclass
class Tensor:
    """A declared tensor: its id and, per partition, size, offset and server."""
    name: str
    count: int
    dtype: str
    tensor_id: int
    parts: list[int]
    servers: list[int]
    codec: dict | None = None     # compression_params; None: uncompressed
    offsets: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.offsets = list(np.cumsum([0] + self.parts[:-1]))
        # Momentum(ErrorFeedback(codec)); its state is kept per partition key
        self.compressor = build_compressor(self.codec, "worker") if self.codec else None


@dataclass
class PushPull:
    """One push_pull of a whole tensor: src is pushed, the aggregate lands in out."""
    tensor: Tensor
    src: np.ndarray
    out: np.ndarray
    divisor: int
    future: Future
    remaining: int
    lr: float | None = None


@dataclass
class PartitionOp:
    job: PushPull
    index: int
    key: int = 0
    round: int = 0
    server: int = 0
    deadline: float = 0.0
    sent_us: float = 0.0
    acked: bool = False   # the server took the push: its credit is free again
