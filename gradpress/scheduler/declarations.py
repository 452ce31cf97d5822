"""Tensor declarations: every worker must declare a tensor alike before it is used.

A tensor gets its id and its partitions' servers when the first worker declares
it, and every worker hears the answer once all workers have declared it with the
same size, dtype and partitions. A mismatch, or a worker that never declares it
within the deadline, is an error naming the tensor: where BytePS hung silently.
No sockets here: the scheduler sends what these methods return.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import numpy as np

from ..placement import MAX_PARTITIONS, KeyPlacement
from ..net.protocol import Op

log = logging.getLogger(__name__)
# Tensors a job may declare (a model has thousands; every name the scheduler keeps for good):
# past it a peer gone wrong would grow the scheduler's memory without end.
MAX_TENSORS = 1 << 20


@dataclass
class Declaration:
    name: str
    spec: tuple[int, str, tuple[int, ...], str]  # (count, dtype, partition element counts, compression)
    tensor_id: int
    servers: list[int]
    first_rank: int
    deadline: float
    ranks: dict[int, bytes] = field(default_factory=dict)  # worker rank -> identity
    failed: str | None = None
    warned: bool = False  # the log said, at half the deadline, whose declaration it waits for


class Declarations:
    def __init__(self, num_workers: int, placement: KeyPlacement, timeout_s: float):
        self.num_workers = num_workers
        self.placement = placement
        self.timeout_s = timeout_s
        self.tensors: dict[str, Declaration] = {}
        self.left: dict[int, str] = {}  # a worker that finished while others went on -> why

    def declare(self, identity: bytes, rank: int, name: str, count: int, dtype: str,
                parts: list, now: float, compression_params: dict | None = None) -> list[tuple[list[bytes], Op, dict]]:
        """Record worker ``rank``'s declaration; returns the messages to send."""
        if not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts) \
                or sum(parts) != count or not parts:
            return [([identity], Op.ERROR, {"name": name, "message":
                    f"tensor {name!r}: partition sizes {parts} do not add up to {count} elements"})]
        if len(parts) > MAX_PARTITIONS:  # (the next tensor's keys would start within them)
            return [([identity], Op.ERROR, {"name": name, "message":
                    f"tensor {name!r}: {len(parts)} partitions, at most {MAX_PARTITIONS}"})]
        if name not in self.tensors and len(self.tensors) >= MAX_TENSORS:
            return [([identity], Op.ERROR, {"name": name, "message":
                    f"tensor {name!r}: the job already declared {MAX_TENSORS} tensors, the most it may"})]
        compression = json.dumps(compression_params, sort_keys=True) if compression_params else "uncompressed"
        spec = (count, dtype, tuple(parts), compression)
        d = self.tensors.get(name)
        if d is None:
            itemsize = np.dtype(dtype).itemsize
            d = Declaration(name, spec, len(self.tensors) + 1,
                            self.placement.place([p * itemsize for p in parts]), rank, now + self.timeout_s)
            self.tensors[name] = d
        if d.failed:
            return [([identity], Op.ERROR, {"name": name, "message": d.failed})]
        if rank in d.ranks:
            # a worker re-declaring (e.g. after re-creating its optimizer) gets the same answer
            if d.spec == spec and len(d.ranks) == self.num_workers:
                return [([identity], Op.DECLARED, self._answer(d))]
            if d.spec == spec:
                return []
        if d.spec != spec:
            d.failed = (f"tensor {name!r}: workers disagree: worker {d.first_rank} declared "
                        f"{_describe(d.spec)}, worker {rank} declared {_describe(spec)}")
            return [(list(d.ranks.values()) + [identity], Op.ERROR, {"name": name, "message": d.failed})]
        gone = next((why for left, why in self.left.items() if left not in d.ranks and left != rank), "")
        if gone:
            d.failed = f"tensor {name!r}: {gone}"
            return [(list(d.ranks.values()) + [identity], Op.ERROR, {"name": name, "message": d.failed})]
        d.ranks[rank] = identity
        if len(d.ranks) == self.num_workers:
            return [(list(d.ranks.values()), Op.DECLARED, self._answer(d))]
        return []

    def expire(self, now: float) -> list[tuple[list[bytes], dict]]:
        """ERROR messages for declarations that some worker never made in time; at half the
        deadline, a line in the log naming whose declarations are awaited (one for them all)."""
        out, late = [], []
        for d in self.tensors.values():
            due = d.deadline if d.warned else d.deadline - self.timeout_s / 2  # its next: the failure, or the log line
            if d.failed or len(d.ranks) == self.num_workers or now <= due:  # (every pass of the scheduler's loop)
                continue
            missing = sorted(set(range(self.num_workers)) - set(d.ranks))
            if not d.warned:
                d.warned = True
                late.append(f"tensor {d.name!r} by worker(s) {missing}")
            if now > d.deadline:
                d.failed = (f"tensor {d.name!r} was declared by worker(s) {sorted(d.ranks)} but not by "
                            f"worker(s) {missing} within GRADPRESS_OP_TIMEOUT_S={self.timeout_s:g} s "
                            f"(do all workers push_pull the same tensors, and did none hang or stall before "
                            f"this one?)")
                out.append((list(d.ranks.values()), {"name": d.name, "message": d.failed}))
        if late:
            log.warning("declarations not yet made, at half of GRADPRESS_OP_TIMEOUT_S=%g s: %s%s", self.timeout_s,
                        late[0], f", and {len(late) - 1} more" if len(late) > 1 else "")
        return out

    def leave(self, rank: int, why: str) -> list[tuple[list[bytes], Op, dict]]:
        """Worker ``rank`` finished while others go on: a declaration it has not made never
        completes. Those waiting on one hear why now, and so does every later one."""
        self.left.setdefault(rank, why)
        out = []
        for d in self.tensors.values():
            if not d.failed and len(d.ranks) < self.num_workers and rank not in d.ranks:
                d.failed = f"tensor {d.name!r}: {why}"
                out.append((list(d.ranks.values()), Op.ERROR, {"name": d.name, "message": d.failed}))
        return out

    @staticmethod
    def _answer(d: Declaration) -> dict:
        count, dtype, parts, _ = d.spec
        itemsize = np.dtype(dtype).itemsize
        return {"name": d.name, "tensor_id": d.tensor_id, "servers": d.servers,
                "part_bytes": [p * itemsize for p in parts]}


def _describe(spec: tuple[int, str, tuple[int, ...], str]) -> str:
    count, dtype, parts, compression = spec
    return f"{count} {dtype} elements in {len(parts)} partition(s), {compression}"
