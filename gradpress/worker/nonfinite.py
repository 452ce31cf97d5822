"""A compressed round skipped for NaN/inf, on a worker: what it pushes and what it lands.

Under loss scaling (``torch.amp.GradScaler``) a gradient that overflows is expected now
and then: the scaler sees the inf, skips the step and lowers its scale. A codec cannot
encode an inf, and error feedback must not take one into its residual. So a worker whose
codec meets NaN/inf (``NonFiniteInput``, its state left as it was) pushes a ``nonfinite``
round without data instead of failing the push_pull; the server skips that round for every
worker (server/store.py), and each lands NaN for the partition, as an uncompressed sum
with an inf in it would, so every worker's scaler skips the step alike. The key's
error-feedback and momentum state then starts again on every worker (``restart``): the
other workers' residuals took in a step that no worker applies, and a fresh start at the
same round keeps every worker's state a function of what all of them saw.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..compressors.arrays import is_device_array

log = logging.getLogger(__name__)
_landed = [0]  # skipped rounds this process has landed (the first is a WARNING, the rest INFO)


def push(error: ValueError) -> tuple[dict[str, Any], list]:
    """The fields (no data) of a round whose input held NaN/inf (``error`` says where)."""
    return {"nonfinite": str(error)}, []


def restart(op: Any, h: dict) -> None:
    """Where reply ``h`` skipped ``op``'s round, the key's codec state restarts (also for a
    push_pull that failed meanwhile: every worker restarts the key at the same round)."""
    if "nonfinite" in h and op.job.tensor.compressor is not None:
        op.job.tensor.compressor.restart(op.wkey.key)


def land(op: Any, h: dict) -> None:
    """Round ``op.round`` of ``op``'s key was skipped (``h["nonfinite"]`` names who met NaN/inf):
    its partition of the output becomes NaN and the key's codec state restarts."""
    dst = op.destination
    restart(op, h)
    if is_device_array(dst):
        from ..kernels.cuda import device
        with device.working_on(dst, landing=True):  # after the landings queued before it
            if hasattr(dst, "fill_"):  # a CUDA tensor: filled there (a copy from pageable memory waits)
                dst.fill_(float("nan"))
            else:
                device.land_divided(np.full(device.length(dst), np.nan, np.float32), dst, 1)
    else:
        dst[...] = np.nan
    _landed[0] += 1
    level = logging.WARNING if _landed[0] == 1 else logging.INFO
    log.log(level, "%s: round %d skipped on every worker, NaN/inf in %s; its average is NaN (a loss "
            "scaler skips the step) and its error-feedback state restarts%s", op.wkey.describe(), op.round,
            h["nonfinite"],
            " (later skipped rounds are logged at INFO)" if level == logging.WARNING else "")
