"""A tensor's partitions compressed together (``GRADPRESS_GROUP_PARTITIONS``): which push_pull
takes every key's next round at once, the marks that keep later ones off those rounds
meanwhile, and the marks' end where the grouped encode fails or outlives its round.

Everything here runs on the communication thread, which owns the keys' rounds; a mark is
cleared elsewhere only as its payload is taken (``PushPull.early_payload``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .jobs import PartitionOp


def take_rounds(op: "PartitionOp", enabled: bool, stages: Any) -> list[int] | None:
    """Whether to compress all of ``op``'s tensor's partitions now, with one set of launches
    (``enabled``; the codec and the tensor must allow it, ``stages.compresses_together``):
    asked once per job, at its first partition sent, and only where no partition of the
    tensor is busy (in flight, holding ops or an early payload) or goes through a local
    owner, so that each key's next round is this job's. If so, the keys' rounds to compress,
    and each key is marked as this job's now, before the compress (which may run on another
    thread) makes the payloads: a later job's partition must not take a key's round
    meanwhile (``PartitionFlight.dispatch`` holds it)."""
    job, t = op.job, op.job.tensor
    if job.compressed is not None:
        return None
    job.compressed = {}
    if not (enabled and len(t.keys) > 1 and t.compressor is not None and t.layout is None
            and stages.compresses_together(job)
            and all(k.in_flight is None and not k.held and k.compressed_by is None and k.via is None
                    and not k.pushers for k in t.keys)):
        return None
    for k in t.keys:
        k.compressed_by = job
    return [k.next_round for k in t.keys]


def unmark(op: "PartitionOp") -> list["PartitionOp"]:
    """``op``'s encode failed (out of memory on the GPU: its own key's payload is never
    taken) or ended after its round did (its deadline passed): its key's mark goes, and
    later jobs' partitions held behind marks now gone, on keys with no round out, are
    handed back to be queued. Nothing else would queue them: only a round's end does, and
    these keys have none out (the tensor's next push_pulls waited out their deadlines)."""
    if op.wkey.compressed_by is op.job:
        op.wkey.compressed_by = None
    return [k.held.popleft() for k in op.job.tensor.keys
            if k.in_flight is None and k.compressed_by is None and k.held]
