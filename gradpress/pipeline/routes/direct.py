"""``direct``: each tensor travels on its own, with its codec or none."""
from __future__ import annotations

from typing import Callable

import torch

from ...compressors.spec import CodecSpec
from ...torch.compression import Compression
from ...torch.dtypes import HALVES, dtype_name
from ..comm import Comm
from . import Route, drain


class DirectRoute(Route):
    """Each member's tensor pushed and pulled apart, named ``names[id]``.

    Args:
        spec: each member's codec (None: uncompressed); ``auto`` travels uncompressed (the
            planner profiles it), and so does a tensor ``Compression.fp16`` made float16. A
            half-precision tensor of its own is compressed widened to float32 on its
            device, and its average narrowed back into it.
        lr_of: a member's current learning rate (corrected error feedback reads it).
        compression: byteps.torch's tensor-level ``Compression``, around each push_pull.
    """
    kind = "direct"

    def __init__(self, members: list[torch.Tensor], names: dict[int, str], priority: dict[int, int],
                 spec: dict[int, CodecSpec | None], lr_of: Callable[[torch.Tensor], float], comm: Comm,
                 compression=Compression.none):
        super().__init__(members)
        self.names, self.priority, self.spec = names, priority, spec
        self.lr_of, self.comm, self.compression = lr_of, comm, compression
        # id -> (handle, compression ctx, the half tensor a widened average narrows into)
        self._pending: dict[int, tuple[int, object, torch.Tensor | None]] = {}

    def submit(self, p: torch.Tensor, tensor: torch.Tensor) -> None:
        sent, ctx = self.compression.compress(tensor)
        spec, narrow = self.spec.get(id(p)), None
        if spec is not None and spec.is_auto:
            spec = None
        if spec is not None and not spec.accepts(dtype_name(sent.dtype)):
            if sent is tensor and sent.dtype in HALVES:
                narrow, sent = sent, sent.float()
            else:
                spec = None
        handle = self.comm.start(sent, self.names[id(p)], priority=self.priority[id(p)], spec=spec,
                                 lr=self.lr_of(p) if spec is not None else None)
        self._pending[id(p)] = (handle, ctx, narrow)

    def finish(self, p: torch.Tensor | None = None) -> dict[int, torch.Tensor]:
        ids = list(self._pending) if p is None else [id(p)]
        out = {}
        for pid in ids:
            handle, ctx, narrow = self._pending.pop(pid)
            result = self.comm.wait(handle)
            if narrow is not None:
                result = narrow.copy_(result)
            out[pid] = self.compression.decompress(result, ctx)
        return out

    def clear(self) -> None:
        pending, self._pending = self._pending, {}
        drain([handle for handle, *_ in pending.values()], self.comm)
