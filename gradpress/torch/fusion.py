"""A plan applied to gradients: fused groups, each pushed and pulled as one tensor.

A group's members are consecutive in backward order (MergeComp): when the last of them
has its gradient, the gradients are copied into the group's flat buffer and the buffer
is push_pulled once, compressed as the plan says. A group of one pushes its gradient in
place, with no copy. A member's ``carry`` (error feedback handed over from a previous
plan) is added to its gradient before it travels.

With ``views`` (DistributedOptimizer's gradients), ``finish`` hands the average back as
views: each member's ``.grad`` becomes its slice of the buffer (host float32, contiguous
parameters; as DDP's ``gradient_as_bucket_view``), so the average is not copied out, and
a gradient still in its view when the group next starts (zeroed in place,
``zero_grad(set_to_none=False)``, and accumulated into by backward) is not copied in
either. The copies out and in had been 9% and 10% of a transformer worker's training
thread (2026-11-23). Without it (a caller that holds the members' ``.grad`` across the
push_pull: OneBitAdam's momentum carriers), and for anything else, the average is copied
into each gradient's own memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..compressors.spec import CodecSpec
from . import ops


@dataclass
class FusedGroup:
    name: str
    members: list[torch.Tensor]          # parameters, in backward order
    spec: CodecSpec | None
    priority: int
    lr_of: dict[int, float]              # id(param) -> its param group's learning rate (read at start)
    views: bool = False                  # hand the average back as views of the buffer (above)
    ready: set[int] = field(default_factory=set)
    handle: int | None = None
    buffer: torch.Tensor | None = None

    @property
    def fused(self) -> bool:
        return len(self.members) > 1

    def mark_ready(self, p: torch.Tensor) -> bool:
        """Record that ``p`` has its gradient; True when the whole group has."""
        self.ready.add(id(p))
        return len(self.ready) == len(self.members)

    def start(self, carry: dict[int, torch.Tensor]) -> None:
        for p in self.members:
            if p.grad is None:  # unused in this backward: every worker must still take part
                p.grad = torch.zeros_like(p)
            extra = carry.pop(id(p), None)
            if extra is not None:
                p.grad.add_(extra.view_as(p.grad))
        lr = self.lr_of[id(self.members[0])] if self.spec is not None else None
        if not self.fused:
            tensor = self.members[0].grad
        else:
            if self.buffer is None:
                self.buffer = torch.empty(sum(p.numel() for p in self.members), dtype=torch.float32)
            grads = [p.grad for p in self.members]
            if self.views and self._in_views(grads):
                pass  # backward accumulated into the buffer itself
            elif _on_host_float32(grads):  # one numpy call instead of a torch op per member
                np.concatenate([g.numpy().reshape(-1) for g in grads], out=self.buffer.numpy())
            else:
                offset = 0
                with torch.no_grad():
                    for g in grads:
                        n = g.numel()
                        self.buffer[offset:offset + n].copy_(g.reshape(-1))
                        offset += n
            tensor = self.buffer
        self.handle = ops.push_pull_async_inplace(tensor, average=True, name=self.name, priority=self.priority,
                                                  compression_params=self.spec, lr=lr)

    def finish(self) -> None:
        """Wait for the group's push_pull and put the averages into the members' gradients."""
        handle, self.handle = self.handle, None
        self.ready.clear()
        out = ops.synchronize(handle)
        if self.fused:
            grads = [p.grad for p in self.members]
            offset = 0
            host = _on_host_float32(grads)
            if host and self.views and all(p.is_contiguous() for p in self.members):
                # ``out`` is the group's buffer: each member's slice of it becomes its gradient
                for p in self.members:
                    n = p.numel()
                    p.grad = out[offset:offset + n].view_as(p)
                    offset += n
            elif host:
                flat = out.numpy()
                for g in grads:
                    view = g.numpy()  # the gradient's own memory, strided or not
                    np.copyto(view, flat[offset:offset + view.size].reshape(view.shape))
                    offset += view.size
            else:
                with torch.no_grad():
                    for g in grads:
                        n = g.numel()
                        g.copy_(out[offset:offset + n].view_as(g))
                        offset += n

    def _in_views(self, grads: list[torch.Tensor]) -> bool:
        """Whether every gradient is still the slice of the buffer that ``finish`` made it."""
        base, offset = self.buffer.data_ptr(), 0
        for g in grads:
            if g.dtype != torch.float32 or not g.is_contiguous() or g.data_ptr() != base + 4 * offset:
                return False
            offset += g.numel()
        return True

    def flat_to_members(self, flat: torch.Tensor) -> dict[int, torch.Tensor]:
        """Split a tensor laid out like the group's buffer into its members' parts."""
        parts, offset = {}, 0
        for p in self.members:
            parts[id(p)] = flat[offset:offset + p.numel()].clone()
            offset += p.numel()
        return parts


def _on_host_float32(grads: list[torch.Tensor]) -> bool:
    """Whether numpy can copy these gradients: float32 in host memory. A group's hooks
    then make one numpy call into the fused buffer instead of a torch op per member:
    68 small gradients in 68 us against 180, and out again in 97 against 177. Each torch
    op also releases the GIL, and may wait for the communication thread to hand it back
    (the copies took 5% of a transformer worker's training thread in a job, 2026-11-23)."""
    return all(g.dtype == torch.float32 and g.device.type == "cpu" and g.layout == torch.strided
               and not g.requires_grad for g in grads)
