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
        """Forget this step's tensors and handles (after a failed step: the next starts afresh)."""
