"""The wrapped optimizer's momentum, folded into the gradients (``momentum: "nesterov"``).

When ``compression_params`` ask for Nesterov momentum, the codec keeps each compressed
gradient's momentum on the worker, before compression, and the wrapped optimizer's own
``momentum`` (applied after, to the average) would count it twice: as in BytePS, a param
group whose gradients carry it gets ``momentum`` 0, and its coefficient becomes the codecs'
``mu`` unless the params give one. The group's other gradients travel uncompressed (under
BYTEPS_MIN_COMPRESS_BYTES, exempted by a rule, made float16 by ``Compression.fp16``, of a
dtype no codec takes) and would lose their momentum with it: ``FoldedMomentum`` gives them
the same Nesterov momentum, on their average, at ``step()`` (where torch's own would act:
after a GradScaler's unscale, never on a step it skips), as BytePS's NAG adapter gives its
uncompressed gradients. Per tensor, as torch's SGD: ``b = mu * b + g`` (``b = g`` at the
first step), and the step reads ``g + mu * b``.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ..compressors.spec import CodecSpec
from ..pipeline import ParameterTable
from .compression import FP16Compressor
from .dtypes import HALVES, dtype_name


def carries_momentum(spec: CodecSpec | None, p: torch.Tensor, compression) -> bool:
    """Whether ``p``'s gradient travels through its codec, whose momentum it then carries (a
    half-precision one widened for it; a float32 one that ``Compression.fp16`` makes float16
    travels without its codec, as ``pipeline.routes`` send it)."""
    if spec is None or not spec.compression_params.get("momentum"):
        return False
    if p.dtype in HALVES:
        return True
    narrows = isinstance(compression, type) and issubclass(compression, FP16Compressor)
    return not (narrows and p.dtype.is_floating_point) and spec.accepts(dtype_name(p.dtype))


class FoldedMomentum:
    """Nesterov momentum of the uncompressed gradients of folded param groups.

    Args:
        mu: the coefficient of each such parameter (by id): its group's momentum, as it was.
        names: each parameter's name (by id), which its buffer is saved under.
    """

    def __init__(self, mu: dict[int, float], names: dict[int, str]):
        self.mu, self.names = mu, names
        self.buffers: dict[int, torch.Tensor] = {}

    @classmethod
    def fold(cls, table: ParameterTable, groups: list[dict], compression) -> "FoldedMomentum | None":
        """Fold each group whose gradients carry a codec's momentum (``table``'s specs are
        given the group's ``mu``; the group's ``momentum`` is set to 0). Returns the momentum
        of those groups' other gradients, or None where there are none."""
        trainable = {id(p) for p in table.trainable}
        raw: dict[int, float] = {}
        for group in groups:
            mu = group.get("momentum")
            members = [p for p in group["params"] if id(p) in trainable]
            coded = {id(p) for p in members if carries_momentum(table.spec.get(id(p)), p, compression)}
            if not mu or not coded:
                continue
            for pid in coded:
                params = table.spec[pid].compression_params
                table.spec[pid] = CodecSpec.from_params(dict(params, mu=params.get("mu", mu)))
            group["momentum"] = 0
            raw.update({id(p): mu for p in members if id(p) not in coded})
        return cls(raw, {pid: table.names[pid] for pid in raw}) if raw else None

    @contextmanager
    def applied(self, params: list[torch.Tensor]):
        """Each such parameter's ``.grad`` as ``g + mu * b`` for the wrapped optimizer's step,
        its own tensor back after (a bucket's view stays one)."""
        kept = []
        with torch.no_grad():
            for p in params:
                mu, g = self.mu.get(id(p)), p.grad
                if mu is None or g is None:
                    continue
                dense = g.to_dense() if g.is_sparse else g
                b = self.buffers.get(id(p))
                if b is None:
                    b = self.buffers[id(p)] = dense.detach().clone()
                else:
                    b.mul_(mu).add_(dense)
                kept.append((p, g))
                p.grad = dense.add(b, alpha=mu)
        try:
            yield
        finally:
            for p, g in kept:
                p.grad = g

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {self.names[pid]: b.detach().cpu().clone() for pid, b in self.buffers.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor], params: list[torch.Tensor]) -> None:
        """The buffers saved (by name); one that was not starts afresh, as a checkpoint of before
        had none (its gradients then trained without momentum)."""
        by_name = {self.names[id(p)]: p for p in params if id(p) in self.mu}
        unknown = sorted(set(state) - set(by_name))
        if unknown:
            raise ValueError(f"this state_dict holds the folded momentum of {unknown[:4]}, which this optimizer "
                             f"sends with their codec's momentum, or with none: restore under the same settings, "
                             f"or drop 'gradpress_folded_momentum' from the state")
        self.buffers = {id(by_name[n]): b.to(by_name[n].device, by_name[n].dtype).clone() for n, b in state.items()}
