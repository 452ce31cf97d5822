"""``ParameterTable``: each parameter's name (the same on every worker), priority and spec.

Every front end (``DistributedOptimizer``, ``OneBitAdam``, ``ZeroOneAdam``, DDP) builds one,
so names, priorities and the checks on ``named_parameters`` live here alone.
"""
from __future__ import annotations

import copy
import fnmatch
import warnings
from typing import Callable, Iterable

import torch

from ..compressors.policy import CompressionPolicy
from ..compressors.spec import CodecSpec
from ..torch.dtypes import dtype_name


class ParameterTable:
    """Names, priorities and compression specs of an optimizer's parameters.

    Args:
        params: every parameter, in the optimizer's order: earlier ones get higher priority
            (the next forward pass needs them first).
        named_parameters: ``model.named_parameters()``, or None (named ``param.<i>``).
        policy: the job's compression policy, or None (nothing compressed).
    Raises:
        ValueError: a malformed ``named_parameters``, a name given twice, or a trainable
            parameter without a name (frozen ones need none: they never travel, as in BytePS).
    """

    def __init__(self, params: list[torch.Tensor], named_parameters: Iterable | None = None,
                 policy: CompressionPolicy | None = None):
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
                raise ValueError("named_parameters must be a sequence of (name, parameter) tuples, "
                                 "as model.named_parameters() gives")
            names = [n for n, _ in named]
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                raise ValueError(f"parameter names must be unique; duplicated: {', '.join(dups)}")
            by_id = {id(p): n for n, p in named}
            unnamed = [tuple(p.shape) for p in params if id(p) not in by_id and p.requires_grad]
            if unnamed:
                raise ValueError(f"{len(unnamed)} trainable parameter(s) of the optimizer are missing from "
                                 f"named_parameters (shapes {unnamed[:5]})")
        else:
            by_id = {id(p): f"param.{i}" for i, p in enumerate(params)}
        self.params = list(params)
        self.trainable = [p for p in params if p.requires_grad]
        # the dtype each parameter's tensor travels in: its own, or an optimizer's state's
        # (``with_policy``); BYTEPS_MIN_COMPRESS_BYTES is compared with those bytes
        self.sent_dtype: Callable[[torch.Tensor], torch.dtype] = _own_dtype
        self.given = by_id  # every name named_parameters gave, the optimizer's parameter or not
        self.names = {id(p): by_id.get(id(p), f"frozen.{i}") for i, p in enumerate(params)}
        self.priority = {id(p): -i for i, p in enumerate(params)}
        self._apply(policy or CompressionPolicy())
        names = list(self.names.values())
        for pattern, _ in self.policy.rules:  # (a typo, or DDP's "module." prefix, silently left the default)
            if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
                warnings.warn(f"compression rule {pattern!r} names none of this optimizer's {len(names)} "
                              f"parameters (such as {names[0]!r}; patterns are fnmatch's, whole names)",
                              stacklevel=3)

    def _apply(self, policy: CompressionPolicy) -> None:
        self.policy = policy
        params = self.params
        # the rule that names a parameter (auto and low-rank take every tensor it names, small
        # ones included: they fuse those), and the codec its tensor gets on its own
        self.rule: dict[int, CodecSpec | None] = {id(p): policy.rule_for(self.names[id(p)]) for p in params}
        self.spec: dict[int, CodecSpec | None] = {id(p): self._spec_for(p, self.names[id(p)]) for p in params}

    def _spec_for(self, p: torch.Tensor, name: str) -> CodecSpec | None:
        dtype = self.sent_dtype(p)
        return self.policy.for_tensor(name, p.numel() * dtype.itemsize, dtype_name(dtype))

    def with_policy(self, policy: CompressionPolicy | None,
                    sent_dtype: Callable[[torch.Tensor], torch.dtype] | None = None) -> "ParameterTable":
        """The same parameters and names under another policy (an optimizer's second path),
        whose tensors travel in ``sent_dtype(p)`` where given (OneBitAdam's float32 momentum of
        a float16 parameter)."""
        other = copy.copy(self)
        other.sent_dtype = sent_dtype or self.sent_dtype
        # each pipeline adopts late parameters into its own table (``adopt``)
        other.params, other.trainable = list(self.params), list(self.trainable)
        other.names, other.priority = dict(self.names), dict(self.priority)
        other._apply(policy or CompressionPolicy())
        return other

    def adopt(self, p: torch.Tensor, name: str) -> None:
        """``p`` became trainable after the table was built (unfrozen, or in a param group
        added later): it travels as ``name`` under the same policy, at its place in the
        optimizer's order (last, if it was not in it). A low-rank or ``auto`` rule's set was
        fixed when its route was built: ``p`` goes uncompressed instead."""
        if id(p) not in self.names:
            self.params.append(p)
            self.priority[id(p)] = -len(self.params)
        self.names[id(p)] = name
        self.trainable.append(p)
        rule = self.policy.rule_for(name)
        self.rule[id(p)] = None if rule is not None and (rule.is_lowrank or rule.is_auto) else rule
        self.spec[id(p)] = None if self.rule[id(p)] is None else self._spec_for(p, name)

    def lowrank(self) -> list[torch.Tensor]:
        """The trainable parameters a powersgd / acpsgd rule names (reduced together)."""
        return [p for p in self.trainable if (r := self.rule[id(p)]) is not None and r.is_lowrank]

    def planned(self) -> list[torch.Tensor]:
        """The trainable floating-point parameters an ``auto`` rule names (the planner's;
        float64 travels uncompressed on its own, half precision widened in the plan's buckets)."""
        return [p for p in self.trainable if p.dtype in (torch.float32, torch.float16, torch.bfloat16)
                and (r := self.rule[id(p)]) is not None and r.is_auto]


def _own_dtype(p: torch.Tensor) -> torch.dtype:
    return p.dtype
