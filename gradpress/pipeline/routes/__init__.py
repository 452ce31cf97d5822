"""Routes: the ways a set of parameters' tensors travel, one module each.

Each step the pipeline hands a route every member's tensor (``submit``), asks it to start
what it holds back (``flush``) and collects each member's average (``finish``). A route
allocates its buffers on the tensors' own device.

- ``direct``: each tensor on its own, with its codec or none;
- ``bucket``: consecutive tensors flattened into one buffer (DDP's buckets, the plan's groups);
- ``rows``: row-sparse tensors, hashed over the servers;
- ``lowrank``: a step's matrices factored together (PowerSGD, ACP-SGD);
- ``planned``: the planner's assignment of the rest.
"""
from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

import torch


class Route:
    """One way a set of parameters' tensors travel (``members``, by ``id``)."""
    kind = ""

    def __init__(self, members: list[torch.Tensor]):
        self.members = list(members)

    def submit(self, p: torch.Tensor, tensor: torch.Tensor) -> None:
        """``p``'s tensor of this step; the route may start sending it at once."""
        raise NotImplementedError

    def flush(self) -> None:
        """Every member has been submitted: start whatever is held back."""

    def finish(self, p: torch.Tensor | None = None) -> dict[int, torch.Tensor]:
        """Wait, and return each member's average by ``id``: all of this step's, or at least
        ``p``'s (a route whose members travel apart may finish just that one)."""
        raise NotImplementedError

    def clear(self) -> None:
        """After a failed step: wait out this step's handles (``drain``) and forget its
        tensors, so that the next step starts afresh."""


def drain(handles: list[int], comm: Any) -> None:
    """Wait out the handles a failed step left started, their errors dropped (the step's own
    goes on): each one's clean-up runs (a CUDA consumer's stream waits for what gradpress's
    streams still write into its tensor) before the route's buffers and the gradients are
    written again, and a key's rounds stay in step. One deadline for them all,
    GRADPRESS_OP_TIMEOUT_S (a handle still pending then is cleaned up when it ends). An
    interrupt (Ctrl-C) is not held up by them."""
    if not handles or isinstance(sys.exc_info()[1], (KeyboardInterrupt, SystemExit)):
        return
    deadline = time.monotonic() + comm.settings.op_timeout_s
    for handle in handles:
        with contextlib.suppress(Exception):
            comm.wait(handle, max(0.0, deadline - time.monotonic()))
