"""The wrapped optimizer's momentum, folded into the gradients (``momentum: "nesterov"``).

When ``compression_params`` ask for Nesterov momentum, the codec keeps each compressed
gradient's momentum on the worker, before compression, and the wrapped optimizer's own
``momentum`` (applied after, to the average) would count it twice: as in BytePS, a param
group whose gradients carry it gets ``momentum`` 0, and its coefficient becomes the codecs'
``mu`` unless the params give one. The group's other gradients travel uncompressed (under
BYTEPS_MIN_COMPRESS_BYTES, exempted by a rule, made float16 by ``Compression.fp16``, of a
dtype no codec takes, or moved to the sparse rows route) and would lose their momentum
with it: ``FoldedMomentum`` gives them the same momentum, the codecs' ``mu`` where they
share one, on their average, at ``step()`` (where torch's own acts: after a GradScaler's
unscale, never on a step it skips), as BytePS's MXNet NAG adapter gives its uncompressed
gradients momentum. Per tensor, as the codecs: ``b = mu * b + g`` (``b = g`` at the first
step), and the step reads ``g + mu * b``: Nesterov's, whatever the group's ``nesterov``
and ``dampening``, on the gradient alone (the optimizer adds weight decay after it).
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Callable

import torch

from ..compressors.spec import CodecSpec
from ..pipeline import ParameterTable
from .compression import narrows_to_half
from .dtypes import HALVES, dtype_name


def carries_momentum(spec: CodecSpec | None, p: torch.Tensor, compression) -> bool:
    """Whether ``p``'s gradient travels through its codec, whose momentum it then carries (a
    half-precision one widened for it; a float32 one that ``Compression.fp16`` makes float16
    travels without its codec, as ``pipeline.routes`` send it)."""
    if spec is None or not spec.compression_params.get("momentum"):
        return False
    if p.dtype in HALVES:
        return True
    return not (narrows_to_half(compression) and p.dtype.is_floating_point) and spec.accepts(dtype_name(p.dtype))


class FoldedMomentum:
    """The folded param groups (by index: their momentum before) and the Nesterov momentum of
    their gradients that travel without a codec's.

    Args:
        table: the optimizer's parameters (names, specs).
        compression: the tensor-level compression (``Compression.fp16`` sends float32 raw).
        route_of: the route a parameter travels on now (a codec's gradient may move to ``rows``).
    """

    def __init__(self, table: ParameterTable, compression, route_of: Callable[[torch.Tensor], str]):
        self.table, self.compression, self.route_of = table, compression, route_of
        self.groups: dict[int, float] = {}          # folded group index -> its momentum before
        self.raw: dict[int, tuple[torch.Tensor, float]] = {}    # id -> (parameter, mu): no codec's momentum
        self.coded: dict[int, tuple[torch.Tensor, float]] = {}  # id -> (parameter, its codec's mu)
        self.buffers: dict[int, torch.Tensor] = {}
        self._warned: set[int] = set()

    def fold(self, groups: list[dict], params: list[torch.Tensor]) -> None:
        """Fold the groups of ``params`` (trainable, not yet seen: all at first, then those
        that became trainable) whose gradients carry a codec's momentum, and every group folded
        before: their codecs get the group's momentum as ``mu`` (unless given), the group
        ``momentum`` 0, and their other gradients a momentum here."""
        mine = {id(p) for p in params}
        for index, group in enumerate(groups):
            members = [p for p in group["params"] if id(p) in mine]
            coded = [p for p in members if carries_momentum(self.table.spec.get(id(p)), p, self.compression)]
            mu = self.groups.get(index, group.get("momentum"))
            if not members or not mu or not (coded or index in self.groups):
                continue
            mus = set()
            for p in coded:
                params = self.table.spec[id(p)].compression_params
                self.table.spec[id(p)] = CodecSpec.from_params(dict(params, mu=params.get("mu", mu)))
                self.coded[id(p)] = (p, params.get("mu", mu))
                mus.add(params.get("mu", mu))
            self.groups[index] = mu
            group["momentum"] = 0
            raw_mu = mus.pop() if len(mus) == 1 else mu  # the codecs' own where they share one
            self.raw.update({id(p): (p, raw_mu) for p in members if id(p) not in self.coded})

    def keep_folded(self, groups: list[dict], loaded: bool = False) -> None:
        """A folded group's momentum back to 0 where it was set again: by ``load_state_dict`` (a
        checkpoint holds the momentum it had), or by an LR scheduler that cycles momentum (its
        value is not taken: the codecs' ``mu`` is fixed; said once)."""
        for index, mu in self.groups.items():
            now = groups[index].get("momentum") if index < len(groups) else None
            if not now:
                continue
            if not (loaded and now == mu) and index not in self._warned:
                self._warned.add(index)
                warnings.warn(f"DistributedOptimizer: param group {index}'s momentum was set to {now} after its "
                              f"gradients' codecs took it (compression_params momentum: nesterov, mu={mu}); "
                              f"set back to 0 so that no momentum is applied twice, mu unchanged", stacklevel=4)
            groups[index]["momentum"] = 0

    def _members(self) -> list[tuple[torch.Tensor, float]]:
        return list(self.raw.values()) + [(p, mu) for p, mu in self.coded.values() if self.route_of(p) == "rows"]

    @contextmanager
    def applied(self, optimizer: torch.optim.Optimizer):
        """Each such parameter's ``.grad`` as ``g + mu * b`` for the wrapped optimizer's step,
        its own tensor back after (a bucket's view stays one). A fused optimizer stepped by a
        GradScaler (``grad_scale``, ``found_inf`` set on it) is handed scaled gradients, and
        skips a step that overflowed: the momentum moves on unscaled ones, and not then."""
        scale, found_inf = getattr(optimizer, "grad_scale", None), getattr(optimizer, "found_inf", None)
        members = self._members()
        if not members or (found_inf is not None and bool(found_inf)):
            yield
            return
        kept, by_kind = [], {}
        for p, mu in members:
            g = p.grad
            if g is not None:
                kept.append((p, g))
                by_kind.setdefault((g.device, g.dtype, mu), []).append((p, g.to_dense() if g.is_sparse else g))
        try:
            with torch.no_grad():
                for (device, _, mu), pairs in by_kind.items():
                    self._step(pairs, mu, None if scale is None else scale.to(device))
            yield
        finally:
            for p, g in kept:
                p.grad = g

    def _step(self, pairs: list, mu: float, scale: torch.Tensor | None) -> None:
        """One kind's momentum (multi-tensor ops: a few launches for many small tensors)."""
        ps, gs = [p for p, _ in pairs], [g for _, g in pairs]
        if scale is not None:
            gs = torch._foreach_div(gs, [scale] * len(gs))
        old = [(b, g) for p, g in zip(ps, gs) if (b := self.buffers.get(id(p))) is not None]
        if old:
            torch._foreach_mul_([b for b, _ in old], mu)
            torch._foreach_add_([b for b, _ in old], [g for _, g in old])
        for p, g in zip(ps, gs):
            if id(p) not in self.buffers:
                self.buffers[id(p)] = g.detach().clone()
        sent = torch._foreach_add(gs, [self.buffers[id(p)] for p in ps], alpha=mu)
        if scale is not None:
            torch._foreach_mul_(sent, [scale] * len(sent))
        for p, s in zip(ps, sent):
            p.grad = s

    def save(self, sd: dict) -> None:
        """Into an optimizer's ``state_dict``: each folded group's momentum as it was built with
        (a plain torch optimizer loads it so), and the buffers (``gradpress_folded_momentum``)."""
        for index, mu in self.groups.items():
            sd["param_groups"][index]["momentum"] = mu
        if self.buffers:
            sd["gradpress_folded_momentum"] = {self.table.names[pid]: b.detach().cpu().clone()
                                               for pid, b in self.buffers.items()}

    def check_loadable(self, state: dict[str, torch.Tensor]) -> None:
        """Raises before anything is loaded where ``state`` names a parameter this optimizer
        gives no folded momentum."""
        known = {self.table.names[pid] for pid in (*self.raw, *self.coded)}
        unknown = sorted(set(state) - known)
        if unknown:
            raise ValueError(f"this state_dict holds the folded momentum of {unknown[:4]}, which this optimizer "
                             f"does not fold (compression_params without momentum: nesterov, or a group without "
                             f"momentum): restore under the same settings, or drop 'gradpress_folded_momentum' "
                             f"from the state")

    def load_state_dict(self, state: dict[str, torch.Tensor], groups: list[dict]) -> None:
        """After the optimizer's own: the folded groups' momentum back to 0 (the checkpoint's is
        the codecs'), and the buffers saved (by name); one that was not starts afresh, as a
        checkpoint of before had none (its gradients then trained without momentum)."""
        self.check_loadable(state)
        self.keep_folded(groups, loaded=True)
        by_name = {self.table.names[pid]: p for pid, (p, _) in (*self.raw.items(), *self.coded.items())}
        self.buffers = {id(by_name[n]): b.to(by_name[n].device, by_name[n].dtype).clone() for n, b in state.items()}
