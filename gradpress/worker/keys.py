"""``Tensor``: a declared tensor; ``WorkerKey``: one partition key as this worker sees it, like
the server's ``KeyState``; ``KeyTable``: every tensor and key of the worker.

Everything the communication thread tracks per key lives here: its next round,
whether the server has its INIT_KEY, the shared-memory push view, a checkpointed
server state waiting to go out, a STATE_GET waiting for its answer, the round in
flight (one per key: a server's shared result slots rely on it) and the ops held
behind it. Checkpoint state is keyed by partition index outside the worker, by key
inside: ``by_partition`` / ``by_key`` translate.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..compressors.spec import CodecSpec
from ..errors import JobError, TensorMismatchError
from ..net.protocol import Op
from ..placement import PARTITION_BITS, make_key
from ..row_placement import RowLayout
from .future import Future


@dataclass
class StateRequest:
    """A server_state() call: the partitions still to answer, and what came back."""
    future: Future
    waiting: set[int]
    results: dict[int, tuple[np.ndarray | None, float | None]] = field(default_factory=dict)

    def answer(self, index: int, residual: np.ndarray | None, lr: float | None) -> None:
        self.results[index] = (residual, lr)
        self.waiting.discard(index)
        if not self.waiting:
            self.future.set(self.results)


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

    def check_alike(self, count: int, dtype: str, spec: CodecSpec | None, layout: RowLayout | None) -> None:
        """Raises TensorMismatchError where a later use of the name differs from its declaration."""
        if self.layout != layout:
            raise TensorMismatchError(f"tensor {self.name!r} was declared with row layout {self.layout}; "
                                      f"now used with {layout}")
        if (self.count, self.dtype, self.spec) != (count, dtype, spec):
            raise TensorMismatchError(f"tensor {self.name!r} was declared with {self.count} {self.dtype} elements "
                                      f"({self.spec or 'uncompressed'}); now used with {count} {dtype} "
                                      f"({spec or 'uncompressed'})")


@dataclass
class WorkerKey:
    key: int
    tensor: "Tensor"
    index: int                     # partition index within the tensor
    server: int
    count: int
    offset: int
    next_round: int = 0
    inited: bool = False
    push_view: np.ndarray | None = None       # our shared push segment (co-located, uncompressed)
    push_region: Any = None                   # ... and its shm.Region, freed when the tensor is released
    state_to_load: tuple[np.ndarray, float | None] | None = None  # sent just before the next push
    state_request: StateRequest | None = None
    in_flight: Any = None                     # the PartitionOp of the round in flight (jobs.py)
    via: int | None = None                    # local reduction: the endpoint of the key's owner, a local peer
    pushers: int = 0                          # ... or, where we own it, the pushes per round (one per machine)
    held: deque = field(default_factory=deque)  # ops of later rounds, waiting for in_flight
    compressed_by: Any = None                 # the PushPull holding this key's next payload, made early

    def describe(self) -> str:
        return f"tensor {self.tensor.name!r}: partition {self.index} (key {self.key})"

    def take_state(self, frames: list, lr: float | None, who: str) -> bool:
        """A STATE reply from ``who``: it answers this key's state request (False: none asked)."""
        request, self.state_request = self.state_request, None
        if request is None:
            return False
        if frames and [f.buffer.nbytes for f in frames] != [4 * self.count]:  # the key's float32 values, one frame
            request.future.fail(JobError(f"{who}: the server state of {self.describe()} is frames of "
                                         f"{[f.buffer.nbytes for f in frames]} bytes, not one of {4 * self.count}"))
        else:
            request.answer(self.index, np.frombuffer(frames[0].buffer, np.float32).copy() if frames else None, lr)
        return True

    @property
    def endpoint(self) -> int:
        """The socket of this key's pushes and pulls: its server, or its owner among the local
        workers (``local.py``), which takes raw values and answers as the server would."""
        return self.server if self.via is None else self.via

    def answers_from(self, op: Op, rank: int) -> bool:
        """Whether endpoint ``rank`` answers this key's ``op``: its pushes' endpoint does; for
        STATE its server; for ERROR either."""
        return rank == self.server if op == Op.STATE else rank == self.endpoint or (
            op == Op.ERROR and rank == self.server)


def by_partition(state: Any, index_of: dict[int, int]) -> Any:
    """A compressor's state_dict with every per-key map re-keyed by partition index."""
    if isinstance(state, dict):
        if state and all(isinstance(k, int) for k in state):
            return {index_of[k]: by_partition(v, index_of) for k, v in state.items() if k in index_of}
        return {k: by_partition(v, index_of) for k, v in state.items()}
    return state


def by_key(state: Any, key_of: dict[int, int], what: str) -> Any:
    """The inverse of ``by_partition``. Raises ValueError for a partition the tensor lacks."""
    if isinstance(state, dict):
        if state and all(isinstance(k, int) for k in state):
            unknown = sorted(set(state) - set(key_of))
            if unknown:
                raise ValueError(f"{what}: saved state for partition(s) {unknown}, but the tensor has "
                                 f"{len(key_of)} (was BYTEPS_PARTITION_BYTES changed?)")
            return {key_of[i]: by_key(v, key_of, what) for i, v in state.items()}
        return {k: by_key(v, key_of, what) for k, v in state.items()}
    return state


def scaled_server_states(states: dict, scale: float) -> dict:
    """Servers' states (partition -> (residual or None, lr)) for a job of ``scale`` times as
    many workers: a residual is a sum over the workers, so that each still adds to the
    average what it lacked (elastic ``resume()``, a checkpoint loaded in another job)."""
    if scale == 1:
        return states
    return {i: (None if r is None else (r * scale).astype(r.dtype), lr) for i, (r, lr) in states.items()}


_OTHER_SETTINGS = ("saved under other compression settings? Load it where the tensor is compressed as it was "
                   "then, or load the optimizer's state without its codecs' (a DistributedOptimizer's "
                   "'gradpress_compression') to start them afresh")


def check_server_states(t: "Tensor", states: dict) -> None:
    held = any(residual is not None for residual, _ in states.values())
    if held and (t.spec is None or not dict(t.spec.params).get("ef")):  # (the server would refuse it at a push)
        now = "it travels uncompressed" if t.spec is None else f"its codec {t.spec.codec} has no error feedback"
        raise ValueError(f"tensor {t.name!r}: the checkpoint holds the servers' error-feedback residuals, but "
                         f"{now} here: {_OTHER_SETTINGS}")
    for i, (residual, _) in states.items():
        if residual is None:
            continue
        if not 0 <= i < len(t.parts) or residual.size != t.parts[i]:
            raise ValueError(f"tensor {t.name!r}: a server state for partition {i} of {residual.size} values "
                             f"does not fit its {len(t.parts)} partition(s) {t.parts}")


class KeyTable:
    """The worker's declared tensors and their keys, and checkpointed states that were
    loaded before their tensor was declared (installed when it is)."""

    def __init__(self) -> None:
        self.tensors: dict[str, "Tensor"] = {}   # written by the communication thread, read by callers
        self.took_loaded: set[str] = set()        # names declared in this job whose loaded states they took
        self._keys: dict[int, WorkerKey] = {}
        self._compressor_states: dict[str, Any] = {}
        self._server_states: dict[str, dict] = {}

    def get(self, key: Any) -> WorkerKey | None:
        return self._keys.get(key)

    def values(self):
        return self._keys.values()

    def add(self, t: "Tensor", num_servers: int) -> None:
        """Make ``t``'s keys and install its pending states. Raises ValueError for a bad placement
        (a scheduler's bug: another tensor's id would land one's sums as the other's)."""
        if type(t.tensor_id) is not int or not 0 <= t.tensor_id < 1 << (63 - PARTITION_BITS) or \
                any(make_key(t.tensor_id, i) in self._keys for i in range(len(t.parts))):
            raise ValueError(f"the scheduler gave it id {t.tensor_id!r}, which is out of range or another tensor's")
        if len(t.servers) != len(t.parts) or any(type(server) is not int for server in t.servers):
            raise ValueError(f"the scheduler placed its {len(t.parts)} partition(s) on servers {t.servers!r}")
        for i, (server, count, offset) in enumerate(zip(t.servers, t.parts, t.offsets)):
            if not 0 <= server < num_servers:
                raise ValueError(f"the scheduler placed partition {i} on server {server}, which does not exist")
            t.keys.append(WorkerKey(make_key(t.tensor_id, i), t, i, server, count, offset))
        if t.name in self._compressor_states or t.name in self._server_states:
            self.took_loaded.add(t.name)
        state = self._compressor_states.get(t.name)
        if state is not None:
            self._install_compressor_state(t, state)
        states = self._server_states.get(t.name)
        if states is not None:
            check_server_states(t, states)
            for i, s in states.items():
                t.keys[i].state_to_load = s
        self._compressor_states.pop(t.name, None)
        self._server_states.pop(t.name, None)
        self.tensors[t.name] = t
        self._keys.update((wk.key, wk) for wk in t.keys)

    def release(self, names: list[str]) -> list["Tensor"]:
        """Forget the declared tensors among ``names`` (with their compressor states; none may
        have a push_pull under way: ``PartitionFlight.busy``); the others, and repeats, are skipped."""
        tensors = [self.tensors[n] for n in dict.fromkeys(names) if n in self.tensors]
        for t in tensors:
            del self.tensors[t.name]
            for wk in t.keys:
                self._keys.pop(wk.key, None)
        return tensors

    def compressor_state(self, name: str) -> Any:
        t = self.tensors.get(name)
        if t is None or t.compressor is None or not hasattr(t.compressor, "state_dict"):
            return self._compressor_states.get(name)
        return by_partition(t.compressor.state_dict(), {wk.key: wk.index for wk in t.keys})

    def pending_server_state(self, name: str) -> dict | None:
        return self._server_states.get(name)

    def pending(self) -> dict[str, tuple[Any, dict | None]]:
        """The states loaded (a checkpoint's) for tensors not declared since: name -> (this
        worker's compressor state, the servers' states), either None."""
        return {name: (self._compressor_states.get(name), self._server_states.get(name))
                for name in sorted(set(self._compressor_states) | set(self._server_states))}

    def load_compressor_state(self, name: str, state: Any) -> None:
        t = self.tensors.get(name)
        if t is None:
            self._compressor_states[name] = state
        else:
            self._install_compressor_state(t, state)

    def load_server_state(self, name: str, states: dict) -> None:
        t = self.tensors.get(name)
        if t is None:
            self._server_states[name] = states
            return
        check_server_states(t, states)
        for i, s in states.items():
            t.keys[i].state_to_load = s

    @staticmethod
    def _install_compressor_state(t: "Tensor", state: Any) -> None:
        if t.compressor is not None and hasattr(t.compressor, "load_state_dict"):
            keyed = by_key(state, {wk.index: wk.key for wk in t.keys}, f"compressor state of tensor {t.name!r}")
            try:
                t.compressor.load_state_dict(keyed)
            except (KeyError, TypeError, AttributeError) as e:  # another chain's state (momentum on, then off)
                raise ValueError(f"tensor {t.name!r}: the checkpoint's compressor state does not fit its "
                                 f"codec here ({t.spec.codec}, {dict(t.spec.params)}; {type(e).__name__}: {e}): "
                                 f"{_OTHER_SETTINGS}") from None
