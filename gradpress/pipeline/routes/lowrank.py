"""``lowrank``: a step's matrices factored together (PowerSGD, ACP-SGD; ``pipeline.lowrank``).

The reducer needs every member's tensor of the step at once, so the route holds them until
``flush`` (the end of backward, or the momentum path's last submit) and reduces them there,
in place. Half-precision tensors are factored widened to float32 on their device, and the
average narrowed back into them.
"""
from __future__ import annotations

import torch

from ...torch.dtypes import HALVES
from ..lowrank import LowRankReducer
from . import Route


class LowRankRoute(Route):
    kind = "lowrank"

    def __init__(self, members: list[torch.Tensor], reducer: LowRankReducer,
                 carry: dict[int, torch.Tensor] | None = None):
        super().__init__(members)
        self.reducer = reducer
        self.carry = carry if carry is not None else {}   # residuals handed over from a previous plan
        self._given: dict[int, torch.Tensor] = {}
        self._narrow: dict[int, torch.Tensor] = {}   # half tensors, by id: their widened copies are reduced
        self._reduced = False

    def submit(self, p: torch.Tensor, tensor: torch.Tensor) -> None:
        if tensor.dtype in HALVES:
            self._narrow[id(p)], tensor = tensor, tensor.float()
        self._given[id(p)] = tensor

    def flush(self) -> None:
        if self._reduced:
            return
        with torch.no_grad():
            for pid, t in self._given.items():
                extra = self.carry.pop(pid, None)
                if extra is not None:
                    t.add_(extra.to(t.device, t.dtype).view_as(t))
            try:
                self.reducer.reduce(self._given)
            except BaseException:
                self.clear()  # its uncompressed bucket, started, waited out: else the next step restarts it
                raise
            for pid, half in self._narrow.items():
                self._given[pid] = half.copy_(self._given[pid])
        self._reduced = True

    def finish(self, p: torch.Tensor | None = None) -> dict[int, torch.Tensor]:
        if not self._given:
            return {}
        self.flush()
        given, self._given, self._narrow, self._reduced = self._given, {}, {}, False
        return given

    def clear(self) -> None:
        self._given, self._narrow, self._reduced = {}, {}, False
        if self.reducer.raw_bucket is not None:
            self.reducer.raw_bucket.clear()
