"""``CompressedAdam``: what ``OneBitAdam`` and ``ZeroOneAdam`` share: Adam's arguments checked,
the parameter table and the pipelines built on it, the step's prologue, the update, and the
pipelines' checkpoints."""
from __future__ import annotations

from typing import Iterable

import torch

from ..compressors.policy import CompressionPolicy
from ..pipeline import GradientPipeline, ParameterTable
from ..pipeline.planning import PlanTuning
from . import adam_math, loss_scaling
from . import momentum_codecs as mc


class CompressedAdam(torch.optim.Optimizer):
    """An Adam whose momentum path travels through gradient pipelines.

    Args (besides Adam's lr, betas, eps and decoupled weight_decay):
        variance_floor: ``sqrt(v)`` is at least this fraction of the tensor's mean ``sqrt(v)``.
        compression_params / compression_rules: the momentum path's codec (``momentum_codecs``
            says what it can carry; ``{"compressor": "auto"}``: planned).
        named_parameters: names must agree across workers.
        plan_tuning: the planner's constants (``compressor: auto``).

    A ``torch.amp.GradScaler`` calls ``step()`` on every worker, overflow or not, and the
    step skips alike on every worker (``loss_scaling``).
    """

    _step_supports_amp_scaling = True  # (GradScaler: the step takes the scale and found_inf itself)

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                 variance_floor: float, compression_params: dict | None, compression_rules: list | None,
                 named_parameters: Iterable | None, plan_tuning: PlanTuning | None):
        mc.check_adam_args(lr, betas, eps, weight_decay, variance_floor)
        self.momentum_policy = mc.momentum_policy(compression_params, compression_rules, type(self).__name__)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.variance_floor = variance_floor
        self.plan_tuning = plan_tuning
        self._table = ParameterTable([p for group in self.param_groups for p in group["params"]], named_parameters)
        self._known = {id(p) for p in self._table.trainable}
        self._index_groups()

    def _pipeline(self, prefix: str, policy: CompressionPolicy | None, state: bool = False) -> GradientPipeline:
        """A pipeline of every trainable parameter, named ``prefix + name``, under ``policy``;
        where ``state``, of tensors in the dtype of Adam's state (``momentum_codecs.state_dtype``)."""
        table = self._table.with_policy(policy, mc.state_dtype if state else None)
        return GradientPipeline(table, prefix, lr_of=lambda p: self._groups[id(p)]["lr"],
                                tuning=self.plan_tuning, owner=type(self).__name__)

    def _keep_state_dtypes(self, state_dict: dict) -> None:
        """torch's ``load_state_dict`` casts every floating state tensor to its parameter's
        dtype: a float16 parameter's float32 state (``momentum_codecs.state_dtype``) is put
        back from ``state_dict`` as it was saved, bit for bit."""
        saved = state_dict["state"]
        for saved_group, group in zip(state_dict["param_groups"], self.param_groups):
            for index, p in zip(saved_group["params"], group["params"]):
                if mc.state_dtype(p) == p.dtype or index not in saved:
                    continue
                for key, value in saved[index].items():
                    if torch.is_tensor(value) and value.is_floating_point() and key != "step":
                        self.state[p][key] = value.to(device=p.device, dtype=mc.state_dtype(p))

    def _index_groups(self) -> None:
        self._groups = {id(p): group for group in self.param_groups for p in group["params"]}

    def _begin(self, closure) -> tuple[object, list[tuple[dict, list[torch.Tensor]]]]:
        """The closure's loss, and each group with its parameters to step, each with Adam's state."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = [(group, [p for p in group["params"] if p.requires_grad]) for group in self.param_groups]
        groups = [(group, ps) for group, ps in groups if ps]
        known = self._known
        late = [self._table.names.get(id(p)) or tuple(p.shape) for _, ps in groups for p in ps if id(p) not in known]
        if late:  # no pipeline, and no variance to freeze at the same step as the others'
            raise ValueError(f"{type(self).__name__}: {late[:5]} became trainable after the optimizer was built; "
                             f"build it again with them (each worker at the same step)")
        for _, ps in groups:
            for p in ps:
                mc.ensure_state(self.state[p], p)
        loss_scaling.unscale(self, [p for _, ps in groups for p in ps])
        return loss, groups

    def _states(self, ps: list[torch.Tensor], key: str) -> list[torch.Tensor]:
        return [self.state[p][key] for p in ps]

    def _local_momenta(self, groups: list[tuple[dict, list[torch.Tensor]]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(parameter, this worker's momentum ``beta1 * m + (1 - beta1) * g`` in a new tensor):
        what travels."""
        sent = []
        for group, ps in groups:
            for chunk in adam_math.chunks(ps):
                sent += zip(chunk, adam_math.momenta(self._states(chunk, "exp_avg"), [p.grad for p in chunk],
                                                     group["betas"][0]))
        return sent

    @staticmethod
    def _gradients(groups: list[tuple[dict, list[torch.Tensor]]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(parameter, a copy of its gradient): what travels where the gradient is averaged
        (the gradient itself stays the worker's own)."""
        ps = [p for _, group_ps in groups for p in group_ps]
        return list(zip(ps, adam_math.copies([p.grad.detach() for p in ps])))

    @staticmethod
    def _average(pipeline: GradientPipeline, tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
        """Every worker's average of each (parameter, tensor), by parameter id."""
        for p, t in tensors:
            pipeline.submit(p, t)
        return pipeline.finish()

    def _apply(self, group: dict, ps: list[torch.Tensor], denoms: list[torch.Tensor], bias1s: list[float]) -> None:
        """``p -= lr * (m / bias1 / denom + weight_decay * p)`` of each of the group's ``ps``."""
        adam_math.apply(ps, self._states(ps, "exp_avg"), denoms, bias1s, group["lr"], group["weight_decay"])

    def _restore(self, state_dict: dict, extra_key: str) -> dict | None:
        """torch's part of ``state_dict`` loaded; returns this optimizer's own part (or None)."""
        state_dict = dict(state_dict)
        extra = state_dict.pop(extra_key, None)
        super().load_state_dict(state_dict)
        self._keep_state_dtypes(state_dict)
        mc.steps_as_ints(self)
        self._index_groups()
        return extra
