"""``ZeroOneAdam``: 0/1 Adam (Lu et al., arXiv 2202.06009; DeepSpeed's ``ZeroOneAdam``).

1-bit Adam needs an uncompressed warm-up to estimate the variance; 0/1 Adam instead
updates the variance from an uncompressed gradient only at steps spaced ever further
apart, and compresses everything else from the start (``zero_one_schedule`` gives the
kind of every step):

- ``variance`` step: the gradient is averaged uncompressed; ``m = b1 m + (1 - b1) g``,
  ``v = b2 v + (1 - b2) g^2``;
- ``momentum`` step: each worker's ``m_i = b1 m + (1 - b1) g_i`` travels compressed with
  error feedback on workers and servers (the 1-bit Adam momentum path, any codec it can
  carry: see ``momentum_codecs``); the pulled average is everyone's ``m``;
- after ``var_freeze_step``, ``local`` steps: ``m = b1 m + (1 - b1) g_i`` with the worker's
  own gradient and a local update, no communication; and ``sync`` steps: the same, then the
  worker's update since the last sync, ``(p - anchor) * denom`` (momentum units, as in
  DeepSpeed), travels compressed (its own tensor, so its residuals start at zero as
  DeepSpeed's are reset at the freeze); every worker sets ``p = anchor + avg / denom`` and
  ``m = -avg / (sum of the lrs since the last sync)``, times ``1 - b1^t`` with
  ``bias_correction`` (so that the corrected ``m_hat`` is that average rate).

The update of every step is ``p -= lr * (m_hat / denom + weight_decay * p)`` with
``denom = max(sqrt(v_hat), variance_floor * mean(sqrt(v_hat))) + eps``: the variance floor
of ``OneBitAdam`` (a compressed momentum gives coordinates whose variance is ~0 a non-zero
value), here applied at every step because v changes until the freeze. With
``bias_correction`` (DeepSpeed accepts the flag but never corrects), ``m_hat = m / (1 -
b1^t)`` and ``v_hat = v / (1 - b2^k)``, k the number of variance updates so far: without
it, v after a few sparse updates is a small fraction of the gradient's variance and the
early steps are too large.

Parameters are bit-identical on every worker after each variance, momentum and sync step
(everyone applies the same pulled bytes to the same anchor); between syncs they differ.
The anchor (the parameters at the last sync) is kept rather than recovered by subtracting
the accumulated update, which float rounding would make differ between workers.

Checkpoints: ``state_dict()`` holds the moments, the anchor, the lr sum, the schedule
(step, both intervals and counters) and both sides' residuals of both compressed tensors;
each worker saves and loads its own (residuals and, between syncs, parameters differ).
"""
from __future__ import annotations

from typing import Iterable

import torch

from ..compressors.policy import CompressionPolicy
from ..pipeline.planning import PlanTuning
from ..torch import ops
from . import adam_math, loss_scaling
from .compressed_adam import CompressedAdam
from .zero_one_schedule import ZeroOneSchedule

GRAD_PREFIX = "ZeroOneAdam.grad."
MOMENTUM_PREFIX = "ZeroOneAdam.momentum."
DELTA_PREFIX = "ZeroOneAdam.delta."


class ZeroOneAdam(CompressedAdam):
    """0/1 Adam for data-parallel training: sparse variance updates, compressed momentum, local steps.

    Args:
        params: parameters or parameter groups, as for ``torch.optim.Adam``.
        lr, betas, eps: as Adam's.
        weight_decay: decoupled (AdamW-style) weight decay.
        var_freeze_step: the last step that may update the variance (max of T_v in the
            paper); local steps follow it. DeepSpeed's default, 100000.
        var_update_scaler: variance updates per variance interval; the interval (1 at
            first) doubles after this many (kappa in the paper). Default 16.
        local_step_scaler: steps after the freeze per local-step interval; the interval
            (1 at first) doubles after this many, up to ``local_step_clipper``. Default 32678.
        local_step_clipper: the largest local-step interval (H in the paper). Default 16.
        bias_correction: divide m by 1 - b1^t and v by 1 - b2^(variance updates).
        compression_params: BytePS ``compression_params`` for the momentum path (default:
            onebit, L2 scale, vanilla error feedback); topk, randomk, dithering or any
            registered codec it can carry (see ``momentum_codecs``), or ``{"compressor": "auto"}``: planned.
        named_parameters: ``model.named_parameters()``; names must agree across workers.
        compression_rules: ``[(pattern, params), ...]`` by parameter name, first match wins.
        variance_floor: ``sqrt(v_hat)`` is at least this fraction of the tensor's mean; 0 disables.
        variance_compression_params: how the gradient of a variance step travels: None
            (uncompressed, the default) or ``{"compressor": "fp16"}``, what DeepSpeed's
            variance steps send when training in fp16; no other codec (v needs the gradient's
            own magnitudes).
        plan_tuning: the planner's constants (``compressor: auto``).
    Raises:
        ValueError: bad arguments (a freeze before the first variance update, a scaler
            below 1, a codec the momentum path cannot carry), before the first step.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, var_freeze_step: int = 100000,
                 var_update_scaler: int = 16, local_step_scaler: int = 32678, local_step_clipper: int = 16,
                 bias_correction: bool = True, compression_params: dict | None = None,
                 named_parameters: Iterable | None = None, compression_rules: list[tuple[str, dict]] | None = None,
                 variance_floor: float = 0.1, variance_compression_params: dict | None = None,
                 plan_tuning: PlanTuning | None = None):
        if variance_compression_params not in (None, {"compressor": "none"}, {"compressor": "fp16"}):
            raise ValueError(f"ZeroOneAdam: variance_compression_params={variance_compression_params!r}: the "
                             "variance needs the gradient at full precision: None or {'compressor': 'fp16'}")
        self.schedule = ZeroOneSchedule(var_freeze_step, var_update_scaler, local_step_scaler, local_step_clipper)
        super().__init__(params, lr, betas, eps, weight_decay, variance_floor, compression_params,
                         compression_rules, named_parameters, plan_tuning)
        self.bias_correction = bias_correction
        self.last_kind: str | None = None  # the kind of the last step taken
        # the job file's rules are for the momentum path: the variance's codec is this argument alone
        self._variance = self._pipeline(GRAD_PREFIX, CompressionPolicy(
            variance_compression_params, None, ops.settings().min_compress_bytes))
        self._momenta = self._pipeline(MOMENTUM_PREFIX, self.momentum_policy, state=True)
        self._deltas = self._pipeline(DELTA_PREFIX, self.momentum_policy, state=True)

    @property
    def in_sync(self) -> bool:
        """True when every worker holds the same parameters (after any step but a local one)."""
        return self.last_kind != "local"

    # ---- the step -----------------------------------------------------------

    @loss_scaling.taking_scale
    @torch.no_grad()
    def step(self, closure=None):
        loss, groups = self._begin(closure)
        kind = self.schedule.next_kind()
        t = self.schedule.step + 1
        var_updates = self.schedule.var_updates + (kind == "variance")
        if kind in ("variance", "momentum"):
            if not self._shared_momentum_step(groups, kind, t, var_updates):
                return loss  # an overflow on some worker: skipped alike on every worker, not counted
        elif not self._local_step(groups, kind == "sync", t, var_updates, loss_scaling.local_overflow(self)):
            kind = "local"  # a sync whose average overflowed: the workers' parameters still differ
        self.schedule.advance()
        self.last_kind = kind
        return loss

    def _shared_momentum_step(self, groups: list, kind: str, t: int, var_updates: int) -> bool:
        """Variance or momentum step: every worker ends with the same m and parameters. False
        (nothing changed) where a GradScaler drives it and an average is not finite."""
        if kind == "variance":
            pipeline, sent = self._variance, self._gradients(groups)
        else:
            pipeline, sent = self._momenta, self._local_momenta(groups)
        averages = self._average(pipeline, sent)
        if loss_scaling.driven(self) and not loss_scaling.all_finite(averages.values()):
            pipeline.after_step(0.0)
            return False
        for group, ps in groups:
            beta1, beta2 = group["betas"]
            for chunk in adam_math.chunks(ps):
                outs = [averages[id(p)] for p in chunk]
                for p in chunk:
                    self.state[p]["step"] += 1
                if kind == "variance":
                    adam_math.accumulate(self._states(chunk, "exp_avg"), self._states(chunk, "exp_avg_sq"), outs,
                                         beta1, beta2)
                else:  # the average of every worker's momentum
                    torch._foreach_copy_(self._states(chunk, "exp_avg"), outs)
                self._apply(group, chunk, self._denominators(group, chunk, var_updates),
                            [self._bias1(group, t)] * len(chunk))
        pipeline.after_step(0.0)
        return True

    def _local_step(self, groups: list, sync: bool, t: int, var_updates: int, overflow: bool = False) -> bool:
        """After the freeze: a local Adam step with the worker's own gradient; on a sync step,
        the update since the last sync is averaged (compressed) and replaces the local one.
        ``overflow`` (this worker's own gradient is not finite, loss_scaling.py): no local
        update, the step counted. Returns whether the workers' parameters are now alike."""
        sent, denoms = [], {}
        for group, ps in groups:
            for p in ps:
                st = self.state[p]
                if "anchor" not in st:  # the first step after the freeze: parameters are identical now
                    st["anchor"], st["lrs"] = p.detach().to(st["exp_avg"].dtype, copy=True), 0.0
                st["step"] += 1
                st["lrs"] += group["lr"]
            for chunk in adam_math.chunks(ps):
                chunk_denoms = self._denominators(group, chunk, var_updates)  # (of v alone)
                if not overflow:
                    adam_math.accumulate(self._states(chunk, "exp_avg"), None, [p.grad for p in chunk],
                                         group["betas"][0], 0.0)
                    self._apply(group, chunk, chunk_denoms, [self._bias1(group, t)] * len(chunk))
                if sync:  # the update since the last sync in momentum units, as DeepSpeed sends it
                    deltas = torch._foreach_sub([p.detach() for p in chunk], self._states(chunk, "anchor"))
                    torch._foreach_mul_(deltas, chunk_denoms)
                    sent += zip(chunk, deltas)
                    denoms.update(zip(map(id, chunk), chunk_denoms))
        if not sync:
            return False
        averages = self._average(self._deltas, sent)
        if loss_scaling.driven(self) and not loss_scaling.all_finite(averages.values()):
            # an overflowed sync (its round skipped): each worker keeps its own parameters, and
            # the next sync averages the updates of both intervals
            self._deltas.after_step(0.0)
            return False
        for group, ps in groups:
            for chunk in adam_math.chunks(ps):
                self._land_sync([averages[id(p)] for p in chunk], chunk, denoms, self._bias1(group, t))
        self._deltas.after_step(0.0)
        return True

    def _land_sync(self, avgs: list, ps: list, denoms: dict, bias1: float) -> None:
        """``p = anchor + avg / denom`` and ``m = -avg / lrs * bias1`` (zero without a step
        since the last sync); the anchor becomes p."""
        landed = torch._foreach_div(avgs, [denoms[id(p)] for p in ps])
        torch._foreach_add_(landed, self._states(ps, "anchor"))  # anchor + avg / denom: a sum's order is exact
        torch._foreach_copy_(ps, landed)
        stepped = [i for i, p in enumerate(ps) if self.state[p]["lrs"] > 0]
        if stepped:
            m_hats = torch._foreach_div([avgs[i] for i in stepped], [-self.state[ps[i]]["lrs"] for i in stepped])
            torch._foreach_mul_(m_hats, bias1)
            torch._foreach_copy_([self.state[ps[i]]["exp_avg"] for i in stepped], m_hats)
        idle = [self.state[p]["exp_avg"] for p in ps if not self.state[p]["lrs"] > 0]
        if idle:
            torch._foreach_zero_(idle)
        torch._foreach_copy_(self._states(ps, "anchor"), ps)
        for p in ps:
            self.state[p]["lrs"] = 0.0

    def _bias1(self, group: dict, t: int) -> float:
        return 1 - group["betas"][0] ** t if self.bias_correction else 1.0

    def _denominators(self, group: dict, ps: list, var_updates: int) -> list:
        bias2 = 1 - group["betas"][1] ** var_updates if self.bias_correction else None
        return adam_math.denominators(self._states(ps, "exp_avg_sq"), [bias2] * len(ps), group["eps"],
                                      self.variance_floor)

    # ---- checkpoints ----------------------------------------------------------

    def state_dict(self) -> dict:
        """torch's optimizer state (moments, anchor, lr sum) plus ``zero_one``: the schedule,
        the floor, the last step's kind and each path's state (both sides' residuals of the
        compressed momentum and delta, low-rank state, a plan's residuals)."""
        sd = super().state_dict()
        sd["zero_one"] = {"schedule": self.schedule.state(), "variance_floor": self.variance_floor,
                          "bias_correction": self.bias_correction, "last_kind": self.last_kind,
                          "momentum": self._momenta.state_dict(residuals=True),
                          "delta": self._deltas.state_dict(residuals=True),
                          "variance": self._variance.state_dict()}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore ``state_dict()``: schedule, moments, anchor and (if present) every path's state."""
        extra = self._restore(state_dict, "zero_one")
        if extra is None:
            return
        self.schedule = ZeroOneSchedule.from_state(extra["schedule"])
        self.variance_floor = extra["variance_floor"]
        self.bias_correction = extra["bias_correction"]
        self.last_kind = extra["last_kind"]
        self._momenta.load_state_dict(extra["momentum"])
        self._deltas.load_state_dict(extra["delta"])
        self._variance.load_state_dict(extra["variance"])
