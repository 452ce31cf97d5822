"""``OneBitAdam``: Adam whose momentum, not its gradient, travels compressed (1-bit Adam,
arXiv 2102.02888).

Two phases, as in the paper and DeepSpeed's ``OnebitAdam``:

- warm-up (the first ``freeze_step`` steps): plain Adam on gradients averaged over all
  workers with an uncompressed push_pull;
- frozen: the second moment ``v`` is frozen (bias-corrected once, at the freeze); each
  worker updates its momentum with its own gradient, ``m_i = beta1 * m + (1 - beta1) * g_i``,
  and the average of the ``m_i`` is pushed and pulled compressed (onebit, L2 scale, with
  error feedback on workers and servers). Every worker pulls the same bytes, so ``m`` and
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

from typing import Iterable

import numpy as np
import torch

from ..compressors.policy import CompressionPolicy
from . import ops

# DeepSpeed's 1-bit Adam: scaled sign with the L2 scale ||x||_2 / sqrt(d), error feedback
DEFAULT_COMPRESSION = {"compressor": "onebit", "scaling": "l2", "ef": "vanilla"}
GRAD_PREFIX = "OneBitAdam.grad."
MOMENTUM_PREFIX = "OneBitAdam.momentum."


class OneBitAdam(torch.optim.Optimizer):
    """Adam for data-parallel training whose momentum travels one-bit compressed after a warm-up.

    Args:
        params: parameters or parameter groups, as for ``torch.optim.Adam``.
        lr, betas, eps: as Adam's.
        weight_decay: decoupled (AdamW-style) weight decay.
        freeze_step: steps of uncompressed Adam before the variance is frozen.
        compression_params: BytePS ``compression_params`` for the momentum (default:
            onebit, L2 scale, vanilla error feedback). No ``momentum`` key: the optimizer's
            momentum is what travels.
        named_parameters: ``model.named_parameters()``; names must agree across workers.
        compression_rules: ``[(pattern, params), ...]`` by parameter name, first match
            wins (``{"compressor": "none"}`` sends that momentum uncompressed).
        variance_floor: after the freeze, ``sqrt(v)`` is at least this fraction of the
            tensor's mean ``sqrt(v)`` (see the module docstring); 0 disables.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, freeze_step: int = 100,
                 compression_params: dict | None = None, named_parameters: Iterable | None = None,
                 compression_rules: list[tuple[str, dict]] | None = None, variance_floor: float = 0.1):
        if not lr >= 0.0:
            raise ValueError(f"lr={lr}: must be >= 0")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas={betas}: each must be in [0, 1)")
        if not eps >= 0.0 or not weight_decay >= 0.0 or not variance_floor >= 0.0:
            raise ValueError("eps, weight_decay and variance_floor must be >= 0")
        if freeze_step < 1:
            raise ValueError(f"freeze_step={freeze_step}: at least one step of Adam must fill the variance")
        policy = CompressionPolicy.for_job(ops.settings(), compression_params, compression_rules)
        if policy.default is None and compression_params is None:
            policy = policy.overridden_by(DEFAULT_COMPRESSION, None)
        for spec in [policy.default] + [spec for _, spec in policy.rules]:
            if spec is not None and "momentum" in spec.compression_params:
                raise ValueError("OneBitAdam sends its own momentum: compression_params must not ask for "
                                 f"worker momentum ('momentum' key): {spec}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.freeze_step = freeze_step
        self.variance_floor = variance_floor
        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            by_id = {id(p): n for n, p in named_parameters}
            missing = [tuple(p.shape) for p in all_params if id(p) not in by_id]
            if missing:
                raise ValueError(f"{len(missing)} parameter(s) missing from named_parameters (shapes {missing[:5]})")
            if len({by_id[id(p)] for p in all_params}) != len(all_params):
                raise ValueError("parameter names must be unique")
        else:
            by_id = {id(p): f"param.{i}" for i, p in enumerate(all_params)}
        self._names = {id(p): by_id[id(p)] for p in all_params}
        self._priority = {id(p): -i for i, p in enumerate(all_params)}
        self._spec = {id(p): policy.for_tensor(self._names[id(p)], p.numel() * p.element_size(),
                                               str(p.dtype).replace("torch.", "")) for p in all_params}

    # ---- the step -----------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [(group, p) for group in self.param_groups for p in group["params"] if p.requires_grad]
        for _, p in params:
            if p.grad is None:  # unused in this backward: every worker must still take part
                p.grad = torch.zeros_like(p)
            st = self.state[p]
            if not st:
                st["step"] = 0
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        frozen = self.frozen
        handles = [self._start(group, p, frozen) for group, p in params]
        for (group, p), (handle, out) in zip(params, handles):
            ops.synchronize(handle)
            st = self.state[p]
            st["step"] += 1
            beta1, beta2 = group["betas"]
            if frozen:
                st["exp_avg"].copy_(out)  # the average of every worker's momentum
            else:
                st["exp_avg"].mul_(beta1).add_(out, alpha=1 - beta1)
                st["exp_avg_sq"].mul_(beta2).addcmul_(out, out, value=1 - beta2)
                if st["step"] == self.freeze_step:
                    self._freeze(st, beta2)
            self._update(group, p, st, beta1)
        return loss

    @property
    def frozen(self) -> bool:
        """True once the warm-up is over: the variance is frozen, the momentum travels compressed."""
        steps = [st["step"] for st in self.state.values() if "step" in st]
        return bool(steps) and max(steps) >= self.freeze_step

    def _start(self, group: dict, p: torch.Tensor, frozen: bool) -> tuple[int, torch.Tensor]:
        name = self._names[id(p)]
        if not frozen:
            buf = p.grad.detach().clone()  # the gradient itself stays the worker's own
            return ops.push_pull_async_inplace(buf, average=True, name=GRAD_PREFIX + name,
                                               priority=self._priority[id(p)]), buf
        st = self.state[p]
        beta1 = group["betas"][0]
        buf = torch.mul(st["exp_avg"], beta1).add_(p.grad, alpha=1 - beta1)  # this worker's momentum
        spec = self._spec[id(p)]
        return ops.push_pull_async_inplace(buf, average=True, name=MOMENTUM_PREFIX + name,
                                           priority=self._priority[id(p)], compression_params=spec,
                                           lr=group["lr"] if spec is not None else None), buf

    def _freeze(self, st: dict, beta2: float) -> None:
        """Bias-correct v once and floor sqrt(v): the denominator of every later step."""
        v = st["exp_avg_sq"]
        v.div_(1 - beta2 ** self.freeze_step)
        if self.variance_floor > 0 and v.numel():
            floor = self.variance_floor * v.sqrt().mean()
            torch.clamp_(v, min=float(floor) ** 2)

    def _update(self, group: dict, p: torch.Tensor, st: dict, beta1: float) -> None:
        t = st["step"]
        if t >= self.freeze_step:
            denom = st["exp_avg_sq"].sqrt().add_(group["eps"])  # frozen, already bias-corrected
        else:
            denom = (st["exp_avg_sq"] / (1 - group["betas"][1] ** t)).sqrt_().add_(group["eps"])
        update = st["exp_avg"] / (1 - beta1 ** t) / denom
        if group["weight_decay"]:
            update.add_(p, alpha=group["weight_decay"])
        p.add_(update, alpha=-group["lr"])

    # ---- checkpoints ----------------------------------------------------------

    def state_dict(self) -> dict:
        """torch's optimizer state plus ``onebit``: freeze_step and both sides' EF residuals."""
        sd = super().state_dict()
        client = ops.client()
        workers, servers = {}, {}
        for name in self._names.values():
            tensor = MOMENTUM_PREFIX + name
            state = client.compressor_state(tensor)
            if state is not None:
                workers[name] = _to_torch(state)
                servers[name] = _to_torch(client.server_state(tensor))
        sd["onebit"] = {"freeze_step": self.freeze_step, "variance_floor": self.variance_floor,
                        "worker_residuals": workers, "server_residuals": servers}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore ``state_dict()``: phase, moments and (if present) both sides' residuals.

        The worker installs its residuals when the momentum is (or was) declared, and sends
        the servers' residuals back just ahead of each key's next push.
        """
        state_dict = dict(state_dict)
        extra = state_dict.pop("onebit", None)
        super().load_state_dict(state_dict)
        for st in self.state.values():  # torch may hand "step" back as a tensor
            if "step" in st and torch.is_tensor(st["step"]):
                st["step"] = int(st["step"].item())
        if extra is None:
            return
        self.freeze_step = extra["freeze_step"]
        self.variance_floor = extra["variance_floor"]
        client = ops.client()
        for name, state in extra["worker_residuals"].items():
            client.load_compressor_state(MOMENTUM_PREFIX + name, _to_numpy(state))
        for name, states in extra.get("server_residuals", {}).items():
            client.load_server_state(MOMENTUM_PREFIX + name, {i: (r, lr) for i, (r, lr) in _to_numpy(states).items()
                                                              if r is not None})


def _to_torch(state):
    """numpy arrays in a nested state as torch tensors (torch.load's weights_only accepts those)."""
    if isinstance(state, dict):
        return {k: _to_torch(v) for k, v in state.items()}
    if isinstance(state, tuple):
        return tuple(_to_torch(v) for v in state)
    return torch.from_numpy(state.copy()) if isinstance(state, np.ndarray) else state


def _to_numpy(state):
    if isinstance(state, dict):
        return {k: _to_numpy(v) for k, v in state.items()}
    if isinstance(state, (tuple, list)):
        return tuple(_to_numpy(v) for v in state)
    return state.numpy() if torch.is_tensor(state) else state
