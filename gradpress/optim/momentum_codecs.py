"""What the momentum path can carry (``momentum_codec_problem``), and the small pieces of Adam
``OneBitAdam`` and ``ZeroOneAdam`` share (``compressed_adam`` holds the rest).

The momentum path: a worker's momentum (or, for 0/1 Adam after the variance freeze, its
accumulated update scaled back to momentum units) is pushed compressed with error feedback
on workers and servers, and the pulled average becomes every worker's momentum. Any
registered codec can carry it, with these exceptions (each a ``ValueError`` at
construction, before the first step), measured with the real codecs over 300 steps of a
momentum recurrence:

- a codec that drops or shrinks part of its input (onebit, topk, randomk without scaling,
  and any codec not known to be unbiased) needs ``ef``: without it that part of the momentum
  is lost at every step (powersgd and acpsgd keep their own error buffers: the momenta of a
  step are factored together by the pipeline's ``lowrank`` route);
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

import torch

from ..compressors import auto
from ..compressors.policy import CompressionPolicy
from ..torch import ops
from . import adam_math

# DeepSpeed's 1-bit and 0/1 Adam: scaled sign with the L2 scale ||x||_2 / sqrt(d), error feedback
DEFAULT_COMPRESSION = {"compressor": "onebit", "scaling": "l2", "ef": "vanilla"}
# codecs whose D(C(x)) is x in expectation (fp16: to rounding): error feedback is optional
# (auto's fp16_raw, float16 on the wire, has none)
UNBIASED = ("dithering", "fp16", "fp16_raw")


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
                    owner: str) -> CompressionPolicy:
    """The job's policy for the momentum path, every spec in it checked by ``momentum_codec_problem``.

    Raises:
        ValueError: naming ``owner``, the spec and what is wrong.
    """
    policy = CompressionPolicy.for_job(ops.settings(), compression_params, compression_rules)
    if policy.default is None and compression_params is None:
        policy = policy.overridden_by(DEFAULT_COMPRESSION, None)
    for where, spec in [("compression_params", policy.default)] + [(f"rule {p!r}", s) for p, s in policy.rules]:
        problem = None if spec is None else momentum_codec_problem(spec.compression_params)
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


def floored_denominator(v_hat: torch.Tensor, floor: float, eps: float) -> torch.Tensor:
    """``max(sqrt(v_hat), floor * mean(sqrt(v_hat))) + eps``: Adam's denominator, with no
    coordinate's step amplified more than ``1 / floor`` over the tensor's typical one (a
    compressed momentum gives coordinates whose variance is ~0 a non-zero value)."""
    return adam_math.floors_([v_hat.sqrt()], floor)[0].add_(eps)


def state_dtype(p: torch.Tensor) -> torch.dtype:
    """The dtype of ``p``'s Adam state: float32 for a float16 or bfloat16 parameter, else its
    own. In float16, eps = 1e-8 is 0 and ``g * g`` is 0 for every |g| below 2.4e-4, so a
    coordinate's denominator is 0 and its step infinite (torch's Adam makes NaN parameters
    of it silently; the momentum path's error feedback refuses it). bfloat16 has float32's
    range but 8 bits of mantissa: ``0.999 * v`` rounds back to ``v``, so the variance never
    decays (torch's Adam keeps it so), and OneBitAdam would freeze the largest it ever was."""
    return torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype


def ensure_state(state: dict, p: torch.Tensor) -> None:
    """Adam's per-parameter state (step, m, v), created at a parameter's first step; a
    parameter without a gradient in this backward gets a zero one (every worker must still
    take part in its push_pull)."""
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p, dtype=state_dtype(p), memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, dtype=state_dtype(p), memory_format=torch.preserve_format)


def steps_as_ints(optimizer: torch.optim.Optimizer) -> None:
    """torch's load_state_dict may hand ``step`` back as a tensor: the schedules count in ints."""
    for st in optimizer.state.values():
        if "step" in st and torch.is_tensor(st["step"]):
            st["step"] = int(st["step"].item())
