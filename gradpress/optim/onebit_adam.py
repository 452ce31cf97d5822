"""``OneBitAdam``: Adam whose momentum, not its gradient, travels compressed (1-bit Adam,
arXiv 2102.02888).

Two phases, as in the paper and DeepSpeed's ``OnebitAdam``:

- warm-up (the first ``freeze_step`` steps): plain Adam on gradients averaged over all
  workers with an uncompressed push_pull;
- frozen: the second moment ``v`` is frozen (bias-corrected once, at the freeze); each
  worker updates its momentum with its own gradient, ``m_i = beta1 * m + (1 - beta1) * g_i``,
  and the average of the ``m_i`` is pushed and pulled compressed (by default onebit, L2
  scale, with error feedback on workers and servers; any codec the momentum path can carry,
  see ``momentum_codecs``). Every worker pulls the same bytes, so ``m`` and
  the parameters stay identical everywhere. The update is
  ``p -= lr * (m / (1 - beta1**t) / (sqrt(v) + eps) + weight_decay * p)``
  (weight decay decoupled, as DeepSpeed's 1-bit Adam and AdamW do).

Why a variance floor: a scaled sign gives every coordinate of a partition the same
magnitude. A coordinate whose gradient was (nearly) zero through the warm-up has
``v`` close to 0, so with Adam's eps = 1e-8 it gets a step up to ``lr * scale / eps``:
training diverges. ``variance_floor`` bounds the denominator below by that fraction of the
tensor's mean ``sqrt(v)`` at the freeze (DeepSpeed's ``exp_avg_mask`` solves the same
problem by hand, for rows known to get no gradient); ``variance_floor=0`` turns it off.

Checkpoints: ``state_dict()`` holds the step count (hence the phase), ``m``, the frozen
``v`` and this worker's error-feedback residuals (by tensor name and partition, as the
worker's ``compressor_state`` gives them, so they survive a new job whose keys differ).
The residuals differ between workers: every worker
saves and loads its own. The servers' residuals are in it too (read from the servers with
STATE_GET, sent back ahead of each key's first push after the restore), so a resumed run
continues bit for bit where the checkpoint left off.
"""
from __future__ import annotations

import time
from typing import Iterable

import torch

from ..pipeline.planning import PlanTuning
from . import adam_math, loss_scaling
from . import momentum_codecs as mc
from .compressed_adam import CompressedAdam

GRAD_PREFIX = "OneBitAdam.grad."
MOMENTUM_PREFIX = "OneBitAdam.momentum."


class OneBitAdam(CompressedAdam):
    """Adam for data-parallel training whose momentum travels compressed after a warm-up.

    Args:
        params: parameters or parameter groups, as for ``torch.optim.Adam``.
        lr, betas, eps: as Adam's.
        weight_decay: decoupled (AdamW-style) weight decay.
        freeze_step: steps of uncompressed Adam before the variance is frozen.
        compression_params: BytePS ``compression_params`` for the momentum (default:
            onebit, L2 scale, vanilla error feedback); topk, randomk, dithering or any
            registered codec the momentum path can carry (``momentum_codecs`` says which
            combinations it cannot, e.g. topk without ``ef``), or ``{"compressor": "auto"}``:
            the planner picks each momentum's codec and fusion.
        named_parameters: ``model.named_parameters()``; names must agree across workers.
        compression_rules: ``[(pattern, params), ...]`` by parameter name, first match
            wins (``{"compressor": "none"}`` sends that momentum uncompressed).
        variance_floor: after the freeze, ``sqrt(v)`` is at least this fraction of the
            tensor's mean ``sqrt(v)`` (see the module docstring); 0 disables.
        plan_tuning: the planner's constants (``compressor: auto``).
    Raises:
        ValueError: bad arguments, or a codec the momentum path cannot carry.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, freeze_step: int = 100,
                 compression_params: dict | None = None, named_parameters: Iterable | None = None,
                 compression_rules: list[tuple[str, dict]] | None = None, variance_floor: float = 0.1,
                 plan_tuning: PlanTuning | None = None):
        if freeze_step < 1:
            raise ValueError(f"freeze_step={freeze_step}: at least one step of Adam must fill the variance")
        super().__init__(params, lr, betas, eps, weight_decay, variance_floor, compression_params,
                         compression_rules, named_parameters, plan_tuning)
        self.freeze_step = freeze_step
        self._grads = self._pipeline(GRAD_PREFIX, None)
        self._momenta = self._pipeline(MOMENTUM_PREFIX, self.momentum_policy, state=True)

    # ---- the step -----------------------------------------------------------

    @loss_scaling.taking_scale
    @torch.no_grad()
    def step(self, closure=None):
        loss, groups = self._begin(closure)
        frozen = self.frozen
        if frozen:  # this worker's momentum travels; the average is everyone's
            sent = self._local_momenta(groups)
        else:
            sent = self._gradients(groups)
        pipeline = self._momenta if frozen else self._grads
        averages = self._average(pipeline, sent)
        if loss_scaling.driven(self) and not loss_scaling.all_finite(averages.values()):
            if frozen:  # (the planner's step boundary all the same)
                pipeline.after_step(0.0)
            return loss  # an overflow on some worker: skipped alike on every worker, not counted
        started = time.perf_counter()
        for group, ps in groups:
            beta1, beta2 = group["betas"]
            for chunk in adam_math.chunks(ps):
                outs, states = [averages[id(p)] for p in chunk], [self.state[p] for p in chunk]
                for st in states:
                    st["step"] += 1
                if frozen:  # the average of every worker's momentum
                    torch._foreach_copy_(self._states(chunk, "exp_avg"), outs)
                else:
                    adam_math.accumulate(self._states(chunk, "exp_avg"), self._states(chunk, "exp_avg_sq"), outs,
                                         beta1, beta2)
                    for st in states:
                        if st["step"] == self.freeze_step:
                            self._freeze(st, beta2)
                self._update(group, chunk, states)
        if frozen:
            pipeline.after_step(time.perf_counter() - started)
        return loss

    @property
    def frozen(self) -> bool:
        """True once the warm-up is over: the variance is frozen, the momentum travels compressed."""
        steps = [st["step"] for st in self.state.values() if "step" in st]
        return bool(steps) and max(steps) >= self.freeze_step

    def _freeze(self, st: dict, beta2: float) -> None:
        """Bias-correct v once and floor sqrt(v): the denominator of every later step."""
        v = st["exp_avg_sq"]
        v.div_(1 - beta2 ** self.freeze_step)
        v.copy_(mc.floored_denominator(v, self.variance_floor, 0.0).square_())

    def _update(self, group: dict, ps: list[torch.Tensor], states: list[dict]) -> None:
        beta1, beta2 = group["betas"]
        # after the freeze v is frozen and already bias-corrected
        bias2s = [None if st["step"] >= self.freeze_step else 1 - beta2 ** st["step"] for st in states]
        denoms = adam_math.denominators(self._states(ps, "exp_avg_sq"), bias2s, group["eps"])
        self._apply(group, ps, denoms, [1 - beta1 ** st["step"] for st in states])

    # ---- checkpoints ----------------------------------------------------------

    def state_dict(self) -> dict:
        """torch's optimizer state plus ``onebit``: freeze_step, the floor, and the momentum
        path's state (both sides' residuals, low-rank state, a plan's residuals)."""
        sd = super().state_dict()
        sd["onebit"] = {"freeze_step": self.freeze_step, "variance_floor": self.variance_floor,
                        **self._momenta.state_dict(residuals=True)}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore ``state_dict()``: phase, moments and (if present) the momentum path's state.

        The worker installs its residuals when the momentum is (or was) declared, and sends
        the servers' residuals back just ahead of each key's next push.
        """
        extra = self._restore(state_dict, "onebit")
        if extra is None:
            return
        self.freeze_step = extra["freeze_step"]
        self.variance_floor = extra["variance_floor"]
        self._momenta.load_state_dict(extra)
