"""What callers ask of the communication thread: one typed command per request.

Callers (the training thread, gradient hooks) put these on the client's queue; the
communication thread, which owns every socket, carries them out in order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compressors.spec import CodecSpec
from .future import Future
from .jobs import PushPull
from .keys import Tensor


@dataclass(frozen=True)
class Declare:
    name: str
    count: int
    dtype: str
    parts: list[int]
    spec: CodecSpec | None
    future: Future
    layout: Any = None      # a RowLayout: the tensor is row-sparse, partition s on server s
    start: StartPushPull | None = None  # the push_pull to start once declared (its job's tensor is set then)


@dataclass(frozen=True)
class StartPushPull:
    job: PushPull
    priority: int


@dataclass(frozen=True)
class Barrier:
    group: str
    future: Future


@dataclass(frozen=True)
class GetServerState:
    tensor: Tensor
    future: Future


@dataclass(frozen=True)
class LoadServerState:
    """Checkpointed server states by partition, sent just ahead of each key's next push."""
    name: str
    states: dict[int, tuple[np.ndarray, float | None]]
    future: Future


@dataclass(frozen=True)
class LoadCompressorState:
    """A checkpointed compressor state (by partition), installed now or when ``name`` is declared."""
    name: str
    state: Any
    future: Future


@dataclass(frozen=True)
class Release:
    """Forget tensors ``names`` (keys, compressor states); with ``servers``, their servers
    forget their keys too."""
    names: list[str]
    servers: bool
    future: Future


@dataclass(frozen=True)
class Finish:
    future: Future
    busy: bool = False  # row-sparse push_pulls of this worker still on the row finder's thread


@dataclass(frozen=True)
class Abort:
    """This worker failed: tell the scheduler (``reason`` is its first error line)."""
    reason: str


def waiters(command: Any) -> list[Future]:
    """The futures callers wait on for ``command``: its own, and a push_pull's job's (one to
    start, or one to start once its tensor is declared)."""
    start = command if isinstance(command, StartPushPull) else getattr(command, "start", None)
    futures = [getattr(command, "future", None), start.job.future if start is not None else None]
    return [f for f in futures if f is not None]
