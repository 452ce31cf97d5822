"""``compressor: auto`` on OneBitAdam's momentum path: the planner picks each momentum
tensor's codec and fusion, as it does for DistributedOptimizer's gradients.

The planner (``auto_plan.AutoPlanner``) works on tensors whose ``.grad`` travels. Here
each parameter gets a stand-in tensor, its *carrier*, whose ``.grad`` holds this worker's
momentum ``beta1 * m + (1 - beta1) * g`` for the step: the planner profiles those (all
ready together, at the start of the optimizer's step), plans, fuses and compresses them,
and leaves the average in the carrier's ``.grad``. Every option is checked by
``momentum_path.momentum_codec_problem`` first (the defaults of ``auto`` all pass).

Checkpoints: the plan's error-feedback residuals (this worker's, and rank 0's share of the
servers') are saved per parameter; a resumed job profiles and plans again, and the saved
residuals join each parameter's first planned push (the re-plan hand-over), so none is lost.
"""
from __future__ import annotations

import torch

from . import ops
from .auto_plan import AutoPlanner


class PlannedMomentum:
    def __init__(self, params: list[torch.Tensor], names: dict[int, str], priority: dict[int, int],
                 lr_of: dict[int, float], compression_params: dict, prefix: str):
        self.carrier = {id(p): torch.zeros_like(p, dtype=torch.float32) for p in params}
        for p in params:
            self.carrier[id(p)].grad = torch.zeros_like(p, dtype=torch.float32)
        carriers = [self.carrier[id(p)] for p in params]
        self.names = {id(self.carrier[id(p)]): prefix + names[id(p)] for p in params}
        self.planner = AutoPlanner(carriers, self.names, {id(self.carrier[id(p)]): priority[id(p)] for p in params},
                                   {id(self.carrier[id(p)]): lr_of[id(p)] for p in params}, compression_params)

    def manages(self, p: torch.Tensor) -> bool:
        return id(p) in self.carrier

    def momentum(self, p: torch.Tensor) -> torch.Tensor:
        """Where this worker's momentum for ``p`` goes before ``send`` (and the average after ``wait``)."""
        return self.carrier[id(p)].grad

    def send(self, p: torch.Tensor) -> int | None:
        """``p``'s momentum is ready: the plan's group takes it (None), or, while the planner
        profiles, it travels uncompressed on its own (the handle)."""
        carrier = self.carrier[id(p)]
        if self.planner.on_ready(carrier):
            return None
        return ops.push_pull_async_inplace(carrier.grad, average=True, name=self.names[id(carrier)],
                                           priority=self.planner.priority[id(carrier)])

    def wait(self) -> None:
        """Finish the plan's groups (the momenta sent on their own are the caller's to wait for)."""
        self.planner.synchronize()

    def after_step(self, update_s: float) -> None:
        self.planner.after_step(update_s)

    # ---- checkpoints --------------------------------------------------------------------

    def residuals(self, names: dict[int, str]) -> dict[str, torch.Tensor]:
        """Each parameter's share of the plan's residuals, by parameter name (``names``: id -> name)."""
        by_carrier = {id(c): pid for pid, c in self.carrier.items()}
        return {names[by_carrier[cid]]: part for cid, part in self.planner.residuals().items()}

    def load_residuals(self, names: dict[int, str], saved: dict[str, torch.Tensor]) -> None:
        """``residuals()`` of a checkpoint: added to each parameter's first planned push."""
        by_name = {names[pid]: c for pid, c in self.carrier.items()}
        unknown = sorted(set(saved) - set(by_name))
        if unknown:
            raise ValueError(f"the checkpoint's planned residuals name unknown parameters {unknown[:5]}")
        for name, part in saved.items():
            carrier = by_name[name]
            if part.numel() != carrier.numel():
                raise ValueError(f"{name}: the checkpoint's planned residual has {part.numel()} elements, "
                                 f"the parameter {carrier.numel()}")
            self.planner.carry[id(carrier)] = part.reshape(-1).to(torch.float32).clone()
