"""``direct``: each tensor travels on its own, with its codec or none."""
from __future__ import annotations

from typing import Callable

import torch

from ...compressors.spec import CodecSpec
from ...torch.compression import Compression
from ...torch.dtypes import dtype_name
from ..comm import Comm
from . import Route


class DirectRoute(Route):
    """Each member's tensor pushed and pulled apart, named ``names[id]``.

    Args:
        spec: each member's codec (None: uncompressed); ``auto`` travels uncompressed (the
            planner profiles it), and so does a tensor the codec cannot take (after
            ``Compression.fp16``: float16).
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
        self._pending: dict[int, tuple[int, object]] = {}   # id -> (handle, compression ctx)

    def submit(self, p: torch.Tensor, tensor: torch.Tensor) -> None:
        sent, ctx = self.compression.compress(tensor)
        spec = self.spec.get(id(p))
        if spec is not None and (spec.is_auto or not spec.accepts(dtype_name(sent.dtype))):
            spec = None
        handle = self.comm.start(sent, self.names[id(p)], priority=self.priority[id(p)], spec=spec,
                                 lr=self.lr_of(p) if spec is not None else None)
        self._pending[id(p)] = (handle, ctx)

    def finish(self, p: torch.Tensor | None = None) -> dict[int, torch.Tensor]:
        ids = list(self._pending) if p is None else [id(p)]
        out = {}
        for pid in ids:
            handle, ctx = self._pending.pop(pid)
            out[pid] = self.compression.decompress(self.comm.wait(handle), ctx)
        return out

    def clear(self) -> None:
        self._pending.clear()
