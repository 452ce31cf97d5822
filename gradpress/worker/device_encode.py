"""A partition's encode on the GPU, run on the host-copies thread (``HostCopies.run``):
its launches and its wait for the payload keep off the communication thread."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .jobs import PartitionOp
    from .stages import PartitionStages, Payload

log = logging.getLogger(__name__)


def encode(stages: "PartitionStages", op: "PartitionOp", rounds: list[int] | None) -> "Payload | ValueError | None":
    """``op``'s payload (with its tensor's other partitions' where ``rounds``), or the
    ValueError refusing its round: an encoder failed on the GPU (out of memory, CUDA), or the
    job failed since it was queued (unread: its caller may be rewriting the tensor)."""
    if op.job.future.done():
        return ValueError(f"its push_pull of tensor {op.job.tensor.name!r} failed before this partition went")
    try:
        if rounds is not None:
            stages.compress_tensor(op.job, rounds)
        return stages.compress(op)
    except ValueError as e:
        return e
    except Exception as e:  # noqa: BLE001 - handed back as the round's refusal
        log.exception("%s: its encoder failed on the GPU", op.wkey.describe())
        return ValueError(f"its encoder failed on the GPU: {type(e).__name__}: {e}")
