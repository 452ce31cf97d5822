"""What ``OneBitAdam`` and ``ZeroOneAdam`` share: the checked codec of the momentum path,
parameter names and specs, the floored Adam denominator, and checkpoints of both sides'
error-feedback residuals.

The momentum path: a worker's momentum (or, for 0/1 Adam after the variance freeze, its
accumulated update scaled back to momentum units) is pushed compressed with error feedback
on workers and servers, and the pulled average becomes every worker's momentum. Any
registered codec can carry it, with these exceptions (each a ``ValueError`` at
construction, before the first step), measured with the real codecs over 300 steps of a
momentum recurrence:

- a codec that drops or shrinks part of its input (onebit, topk, randomk without scaling,
  and any codec not known to be unbiased) needs ``ef``: without it that part of the momentum
  is lost at every step (powersgd and acpsgd keep their own error buffers: the momenta of a
  step are factored together, ``ParameterTable`` and ``lowrank.LowRankReducer``);
- ``randomk`` with ``scaling`` (unbiased, n/k times the sent values) cannot carry it at
  all: with ``ef`` its residual is ``-(n/k - 1) x`` on the sent coordinates and grows
  without bound (mean |m| 0.09 to 16,000 in 300 steps at k = 1%); without, the pulled
  momentum is fed back through ``beta1 * m``, so its variance grows by about
  ``beta1^2 n/k`` per step (a regression's loss reached 1e27 in 40 steps of OneBitAdam, 1e9
  of ZeroOneAdam, at k = 10%, tests/test_momentum_path.py);
- ``onebit`` needs a scale (``scaling``: l1 or l2): without one every coordinate of the
  momentum becomes +-1;
- worker momentum (a ``momentum`` key): the optimizer's own momentum is what travels.

Dithering (unbiased, its error bounded by the norm / s) works with or without ``ef``
(mean |m| stays at the uncompressed value in the same probe).
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import torch

from ..compressors import auto
from ..compressors.policy import CompressionPolicy
from ..compressors.spec import CodecSpec
from . import ops

# DeepSpeed's 1-bit and 0/1 Adam: scaled sign with the L2 scale ||x||_2 / sqrt(d), error feedback
DEFAULT_COMPRESSION = {"compressor": "onebit", "scaling": "l2", "ef": "vanilla"}
# codecs whose D(C(x)) is x in expectation (fp16: to rounding): error feedback is optional
UNBIASED = ("dithering", "fp16")


def momentum_codec_problem(params: dict) -> str | None:
    """Why the momentum path cannot carry ``params`` (already checked by ``CodecSpec``), or None."""
    codec = params.get("compressor", "none")
    if codec == auto.AUTO:  # every option the planner may pick must be one the path can carry
        for name, option in auto.options(params).items():
            if auto.low_rank({name: option}):
                return (f"option {name!r} of compressor 'auto': the momentum path's planner does not take "
                        f"low-rank options (give the momenta compressor {option['compressor']!r} itself)")
            problem = momentum_codec_problem(option)
            if problem:
                return f"option {name!r} of compressor 'auto': {problem}"
        return None
    has_ef = params.get("ef") is not None
    if "momentum" in params:
        return "the optimizer's own momentum travels: compression_params must not ask for worker momentum " \
               "('momentum' key)"
    if codec == "none":
        return None
    from ..compressors.lowrank import CODECS as LOW_RANK
    if codec in LOW_RANK:
        return None  # error feedback is part of the method
    scaled = str(params.get("scaling", False)).lower() not in ("false", "0", "no", "off", "none")
    if codec == "onebit" and not scaled:
        return "onebit on the momentum path needs 'scaling' (l1 or l2): without it every coordinate becomes +-1"
    if codec == "randomk" and scaled:
        return "randomk with 'scaling' diverges on the momentum path: with error feedback its residual grows " \
               "by n/k every round (it is not contractive), without it the n/k-scaled noise is fed back through " \
               "beta1 * m; use randomk without 'scaling', with 'ef'"
    if codec not in UNBIASED and not has_ef:
        return f"{codec} drops part of the momentum at every step: it needs error feedback ('ef': vanilla " \
               "or corrected)"
    return None


def momentum_policy(compression_params: dict | None, compression_rules: list | None,
                    owner: str, auto_ok: bool = False) -> CompressionPolicy:
    """The job's policy for the momentum path, every spec in it checked by ``momentum_codec_problem``.

    Args:
        auto_ok: whether ``owner`` plans its momentum path (``compressor: auto``).
    Raises:
        ValueError: naming ``owner``, the spec and what is wrong.
    """
    policy = CompressionPolicy.for_job(ops.settings(), compression_params, compression_rules)
    if policy.default is None and compression_params is None:
        policy = policy.overridden_by(DEFAULT_COMPRESSION, None)
    for where, spec in [("compression_params", policy.default)] + [(f"rule {p!r}", s) for p, s in policy.rules]:
        problem = None if spec is None else momentum_codec_problem(spec.compression_params)
        if spec is not None and spec.is_auto and not auto_ok:
            problem = "compressor 'auto' is not available on this optimizer's momentum path; name a codec"
        if problem:
            raise ValueError(f"{owner}: {where} ({spec}): {problem}")
    return policy


def check_adam_args(lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                    variance_floor: float) -> None:
    """Adam's arguments, checked before anything is built."""
    if not lr >= 0.0:
        raise ValueError(f"lr={lr}: must be >= 0")
    if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
        raise ValueError(f"betas={betas}: each must be in [0, 1)")
    if not eps >= 0.0 or not weight_decay >= 0.0 or not variance_floor >= 0.0:
        raise ValueError("eps, weight_decay and variance_floor must be >= 0")


class ParameterTable:
    """Each parameter's name (agreed across workers), priority and momentum-path spec."""

    def __init__(self, all_params: list[torch.Tensor], named_parameters: Iterable | None,
                 policy: CompressionPolicy):
        if named_parameters is not None:
            by_id = {id(p): n for n, p in named_parameters}
            # as in BytePS, only trainable parameters need a name: frozen ones never travel
            missing = [tuple(p.shape) for p in all_params if id(p) not in by_id and p.requires_grad]
            if missing:
                raise ValueError(f"{len(missing)} trainable parameter(s) missing from named_parameters "
                                 f"(shapes {missing[:5]})")
            named = [by_id[id(p)] for p in all_params if id(p) in by_id]
            if len(set(named)) != len(named):
                raise ValueError("parameter names must be unique")
        else:
            by_id = {id(p): f"param.{i}" for i, p in enumerate(all_params)}
        self.names = {id(p): by_id.get(id(p), f"frozen.{i}") for i, p in enumerate(all_params)}
        self.priority = {id(p): -i for i, p in enumerate(all_params)}
        self.spec = {id(p): policy.for_tensor(self.names[id(p)], p.numel() * p.element_size(),
                                              str(p.dtype).replace("torch.", "")) for p in all_params}
        # powersgd / acpsgd: a step's momenta are factored together once all of them are given
        self._params = all_params
        self.lowrank_ids = {id(p) for p in all_params if p.requires_grad and (s := self.spec[id(p)]) is not None
                            and s.is_lowrank}
        if len({str(self.spec[i]) for i in self.lowrank_ids}) > 1:
            raise ValueError("powersgd / acpsgd on the momentum path: every low-rank momentum must have the same "
                             f"compression_params, got {sorted({str(self.spec[i]) for i in self.lowrank_ids})}")
        self._reducers: dict = {}   # prefix -> LowRankReducer
        self._waiting: dict[str, list] = {}

    def push_pull(self, buf: torch.Tensor, p: torch.Tensor, prefix: str, lr: float,
                  compressed: bool) -> int:
        """Start averaging ``buf`` (parameter ``p``'s) as tensor ``prefix + name``; compressed
        by the momentum path's spec when ``compressed``. Returns the handle."""
        if compressed and id(p) in self.lowrank_ids:
            return self._low_rank(buf, p, prefix)
        spec: CodecSpec | None = self.spec[id(p)] if compressed else None
        return ops.push_pull_async_inplace(buf, average=True, name=prefix + self.names[id(p)],
                                           priority=self.priority[id(p)], compression_params=spec,
                                           lr=lr if spec is not None else None)

    def _low_rank(self, buf: torch.Tensor, p: torch.Tensor, prefix: str) -> int:
        """Hold ``buf`` until every low-rank momentum of the step has been given, then factor them
        together; each handle completes then (a handle synchronized earlier times out)."""
        handle, future = ops.deferred(buf, f"low-rank {prefix}{self.names[id(p)]}")
        waiting = self._waiting.setdefault(prefix, [])
        waiting.append((p, buf, future))
        if len(waiting) == len(self.lowrank_ids):
            del self._waiting[prefix]
            try:
                with torch.no_grad():
                    self._reducer(prefix).reduce({id(q): b for q, b, _ in waiting})
            except BaseException as e:
                for *_, f in waiting:
                    f.fail(e)
                raise
            for *_, f in waiting:
                f.set()
        return handle

    def _reducer(self, prefix: str):
        if prefix not in self._reducers:
            from ..compressors.lowrank import LowRankParams
            from .lowrank import LowRankReducer
            entries = [(self.names[id(p)], p) for p in self._params if id(p) in self.lowrank_ids]
            params = LowRankParams.parse(self.spec[id(entries[0][1])].compression_params)
            self._reducers[prefix] = LowRankReducer(entries, params, prefix, ops.settings().min_compress_bytes)
        return self._reducers[prefix]

    def lowrank_state(self) -> dict:
        """Each low-rank path's step, kept factors and this worker's error buffers, by prefix."""
        return {prefix: r.state_dict() for prefix, r in self._reducers.items()}

    def load_lowrank_state(self, states: dict) -> None:
        for prefix, state in states.items():
            self._reducer(prefix).load_state_dict(state)


def floored_denominator(v_hat: torch.Tensor, floor: float, eps: float) -> torch.Tensor:
    """``max(sqrt(v_hat), floor * mean(sqrt(v_hat))) + eps``: Adam's denominator, with no
    coordinate's step amplified more than ``1 / floor`` over the tensor's typical one (a
    compressed momentum gives coordinates whose variance is ~0 a non-zero value)."""
    root = v_hat.sqrt()
    if floor > 0 and root.numel():
        torch.clamp_(root, min=float(floor * root.mean()))
    return root.add_(eps)


def ensure_state(state: dict, p: torch.Tensor) -> None:
    """Adam's per-parameter state (step, m, v), created at a parameter's first step; a
    parameter without a gradient in this backward gets a zero one (every worker must still
    take part in its push_pull)."""
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


# ---- checkpoints of the error-feedback residuals -----------------------------------------

def save_residuals(tensors: dict[str, str]) -> tuple[dict, dict]:
    """(worker residuals, server residuals) of ``{label: tensor name}``, for tensors that
    were compressed; the labels key them in the checkpoint (names survive a new job)."""
    client = ops.client()
    workers, servers = {}, {}
    for label, tensor in tensors.items():
        state = client.compressor_state(tensor)
        if state is not None:
            workers[label] = to_torch(state)
            servers[label] = to_torch(client.server_state(tensor))
    return workers, servers


def load_residuals(tensors: dict[str, str], workers: dict, servers: dict) -> None:
    """Hand ``save_residuals``' output back to this worker and (at each key's next push) the servers."""
    client = ops.client()
    for label, state in workers.items():
        client.load_compressor_state(tensors[label], to_numpy(state))
    for label, states in servers.items():
        client.load_server_state(tensors[label], {i: (r, lr) for i, (r, lr) in to_numpy(states).items()
                                                  if r is not None})


def steps_as_ints(optimizer: torch.optim.Optimizer) -> None:
    """torch's load_state_dict may hand ``step`` back as a tensor: the schedules count in ints."""
    for st in optimizer.state.values():
        if "step" in st and torch.is_tensor(st["step"]):
            st["step"] = int(st["step"].item())


def to_torch(state):
    """numpy arrays in a nested state as torch tensors (torch.load's weights_only accepts those)."""
    if isinstance(state, dict):
        return {k: to_torch(v) for k, v in state.items()}
    if isinstance(state, tuple):
        return tuple(to_torch(v) for v in state)
    return torch.from_numpy(state.copy()) if isinstance(state, np.ndarray) else state


def to_numpy(state):
    if isinstance(state, dict):
        return {k: to_numpy(v) for k, v in state.items()}
    if isinstance(state, (tuple, list)):
        return tuple(to_numpy(v) for v in state)
    return state.numpy() if torch.is_tensor(state) else state
