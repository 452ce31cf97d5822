"""``rows``: row-sparse tensors travel as their rows, hashed over the servers.

A sparse COO tensor (``nn.Embedding(sparse=True)``'s gradient) always travels this way: its
parameter moves here when its first one arrives. A dense tensor of 2+ dimensions moves here
at a step boundary when ``DensityVote`` finds it mostly zero rows: the fraction of non-zero
rows, averaged over every worker on its first step (one tiny push_pull, so that every
worker decides alike), below ``GRADPRESS_SPARSE_DENSITY``; its non-zero rows then travel
and the union comes back dense, zero elsewhere. The sums are exact: no codec, no error
feedback.
"""
from __future__ import annotations

import torch

from ...torch.compression import Compression
from ...torch.dtypes import WIRE
from ...torch.sparse import is_row_sparse
from ..comm import Comm
from . import Route, drain


class RowsRoute(Route):
    """Members' tensors averaged row-sparse: COO as COO (``names[id]``), dense as its rows
    (``"Sparse" + names[id]``)."""
    kind = "rows"

    def __init__(self, names: dict[int, str], priority: dict[int, int], comm: Comm, compression=Compression.none):
        super().__init__([])
        self.names, self.priority, self.comm, self.compression = names, priority, comm, compression
        self.coo: set[int] = set()   # members whose tensors come as sparse COO
        self._pending: dict[int, tuple[int, object]] = {}

    def add(self, p: torch.Tensor, coo: bool) -> None:
        if all(q is not p for q in self.members):
            self.members.append(p)
        if coo:
            self.coo.add(id(p))

    def submit(self, p: torch.Tensor, tensor: torch.Tensor) -> None:
        sent, ctx = self.compression.compress(tensor)
        if id(p) in self.coo:
            if not is_row_sparse(sent):  # backward did not reach it: the zeros stand in, as no rows
                sent = sent.to_sparse(1)
            handle = self.comm.start(sent, self.names[id(p)], priority=self.priority[id(p)])
        else:
            handle = self.comm.start_rows(sent, "Sparse" + self.names[id(p)], priority=self.priority[id(p)])
        self._pending[id(p)] = (handle, ctx)

    def finish(self, p: torch.Tensor | None = None) -> dict[int, torch.Tensor]:
        ids = list(self._pending) if p is None else [id(p)]
        out = {}
        for pid in ids:
            handle, ctx = self._pending.pop(pid)
            out[pid] = self.compression.decompress(self.comm.wait(handle), ctx)
        return out

    def clear(self) -> None:
        pending, self._pending = self._pending, {}
        drain([handle for handle, _ in pending.values()], self.comm)


class DensityVote:
    """Which dense tensors travel row-sparse from their second step on (module docstring)."""

    def __init__(self, threshold: float, names: dict[int, str], comm: Comm):
        self.threshold, self.names, self.comm = threshold, names, comm
        self.decided: dict[int, bool] = {}                  # id -> travels row-sparse
        self._probes: dict[int, int] = {}                   # id -> handle of its density's push_pull

    def consider(self, p: torch.Tensor, tensor: torch.Tensor) -> None:
        """On ``p``'s first step, push this worker's fraction of non-zero rows."""
        pid = id(p)
        if (pid in self.decided or pid in self._probes or self.threshold <= 0 or tensor.dim() < 2
                or tensor.shape[0] < 2 or tensor.numel() == 0 or tensor.dtype not in WIRE or is_row_sparse(tensor)):
            # (rows of no width, a (5, 0) parameter's, have nothing to send: it travels dense, empty)
            return
        self._probes[pid] = self.comm.start(nonzero_fraction(tensor), "SparseDensity." + self.names[pid])

    def settle(self) -> list[int]:
        """At the step's end: decide from the means pushed (every worker got the same); the ids
        that travel row-sparse from now on."""
        probes, self._probes = self._probes, {}
        for pid, handle in probes.items():
            self.decided[pid] = float(self.comm.wait(handle)[0]) < self.threshold
        return [pid for pid in probes if self.decided[pid]]


def nonzero_fraction(tensor: torch.Tensor) -> torch.Tensor:
    """The fraction of ``tensor``'s rows (its first dimension) holding any non-zero value, NaN
    included, as a 1-element float64 tensor on ``tensor``'s device. Counted where the gradient
    lives and on the caller's stream: a GPU's vote, inside the backward hook, neither waits for
    the device nor copies rows to the host; its push_pull moves these 8 bytes like any gradient."""
    rows = tensor.detach().reshape(tensor.shape[0], -1)
    return (rows != 0).any(1).sum(dtype=torch.float64).div(rows.shape[0]).reshape(1)
