"""Which of a pipeline's parameters are fused into buckets (``routes.bucket``), and the
buckets' names and priorities. Three ways, each cutting parameters last to first, as
backward makes them:

- ``ddp``: DDP's buckets (``bucket_cap_mb``), neighbours of one spec and dtype;
- ``small``: 1-D tensors that travel uncompressed anyway (GRADPRESS_FUSE_BELOW_BYTES),
  neighbours among themselves, into buckets of up to a partition;
- ``compressed``: gradients one codec compresses (GRADPRESS_FUSE_COMPRESSED_BYTES),
  neighbours among themselves of one spec, dtype and learning rate.

A run of one stays on the direct route. A bucket is named by its members (a crc of their
names), never by a count: two optimizers in one process (a GAN's, or a model per dtype)
each fuse their own, and a count would give both the same keys; a resumed job finds its
keys again.
"""
from __future__ import annotations

import zlib
from typing import Callable

import torch

from .comm import Comm
from .routes.bucket import Bucket
from .table import ParameterTable

Same = Callable[[torch.Tensor, torch.Tensor], bool]


def runs(params: list[torch.Tensor], cap: float, same: Same) -> list[list[torch.Tensor]]:
    """``params`` last to first, cut at ``cap`` bytes or where ``same(p, the run's first)`` fails."""
    out, current, size = [], [], 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if current and (not same(p, current[0]) or size + nbytes > cap):
            out.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
    if current:
        out.append(current)
    return out


def alike(p: torch.Tensor, q: torch.Tensor) -> bool:
    """Whether two tensors may share a bucket: one dtype, and one device (a model placed
    across GPUs in one process has a bucket per device; a buffer lives on one)."""
    return p.dtype == q.dtype and p.device == q.device


def crc(table: ParameterTable, members: list[torch.Tensor]) -> str:
    """A group's name from its members' (the same in every worker and every resumed job)."""
    return f"{zlib.crc32(','.join(table.names[id(p)] for p in members).encode()):08x}"


class Fusion:
    """Makes a pipeline's buckets (its table, tensor-name prefix, comm, learning rates and
    tensor-level ``Compression`` passed on to each)."""

    def __init__(self, table: ParameterTable, prefix: str, comm: Comm, lr_of, compression) -> None:
        self.table, self.prefix, self.comm, self.lr_of, self.compression = table, prefix, comm, lr_of, compression

    def priority(self, members: list[torch.Tensor]) -> int:
        """A fused group's priority: its most urgent member's."""
        return max(self.table.priority[id(p)] for p in members)

    def ddp(self, params: list[torch.Tensor], cap: float) -> list[Bucket]:
        """DDP's buckets: neighbours of one spec and dtype, up to ``cap`` bytes."""
        spec = self.table.spec
        cut = runs(params, cap, lambda p, q: spec[id(p)] == spec[id(q)] and alike(p, q))
        return [Bucket(f"{self.prefix}bucket.{i}", run, spec[id(run[0])], self.priority(run), self.comm, self.lr_of,
                       compression=self.compression) for i, run in enumerate(cut) if len(run) > 1]

    def small(self, params: list[torch.Tensor], below: int) -> list[Bucket]:
        """Small 1-D tensors (biases, norms: often most of a model's tensors and a sliver of its
        bytes) under ``below`` bytes that travel uncompressed anyway (no spec: no codec, or
        under BYTEPS_MIN_COMPRESS_BYTES), of one dtype, into buckets of up to a partition,
        each one message a round instead of one per tensor. Their sums and averages are the
        same, element for element, as each tensor's alone, and each average is copied back
        into its own tensor (``p.grad`` stays the tensor it was, as in BytePS)."""
        spec = self.table.spec
        small = [p for p in params if 0 < p.numel() * p.element_size() < below and p.dim() == 1 and spec[id(p)] is None]
        cut = runs(small, self.comm.settings.partition_bytes, alike)
        return [Bucket(f"{self.prefix}small-fused.{crc(self.table, run)}", run, None, self.priority(run), self.comm,
                       compression=self.compression) for run in cut if len(run) > 1]

    def compressed(self, params: list[torch.Tensor], cap: int) -> list[Bucket]:
        """Gradients a codec compresses (a spec of their own) of one spec and dtype, into
        buckets of up to ``cap`` bytes; a gradient of ``cap`` bytes or more travels alone.
        A bucket is one push_pull of its members laid end to end, partitioned as any tensor
        is: on a GPU worker one set of kernel launches and one copy to the host for all its
        partitions (each gradient cost its own: about 0.4 ms a gradient for onebit on an
        H200), and fewer, fuller partitions on the wire. The codec's partitions then span
        gradients (each partition keeps its own scale, selection and residual), so the bits
        differ from each gradient compressed alone, as MergeComp's groups do."""
        spec, lr = self.table.spec, self.lr_of
        coded = [p for p in params if spec[id(p)] is not None and p.numel() * p.element_size() < cap]
        # one learning rate too: a compressed push carries its bucket's first member's, by
        # which corrected error feedback scales the whole bucket's residual
        cut = runs(coded, cap, lambda p, q: spec[id(p)] == spec[id(q)] and alike(p, q) and lr(p) == lr(q))
        return [Bucket(f"{self.prefix}fused.{crc(self.table, run)}", run, spec[id(run[0])], self.priority(run),
                       self.comm, self.lr_of, compression=self.compression) for run in cut if len(run) > 1]
