"""``bucket``: consecutive tensors flattened into one buffer and push_pulled as one.

The one fusion mechanism: DDP's buckets, the planner's groups (MergeComp: consecutive in
backward order) and a low-rank reducer's uncompressed tensors all use it. When the last
member's tensor is submitted, the tensors are copied into the bucket's flat buffer (made
once, on the members' device, in their dtype; float32 where a codec takes half-precision
members or the dtypes differ) and the buffer travels; ``finish`` copies the average back
into each submitted tensor. Both copies are batched (``torch.cat`` into the buffer, torch's
multi-tensor copy out of it): on a GPU a group of many small tensors costs a launch or a
few, not one per member. A bucket of one sends its tensor in place where it can.

``views`` (DistributedOptimizer's gradients, as DDP's ``gradient_as_bucket_view``): the
averages come back as slices of the buffer instead of copies, and a tensor that is still
its slice when the bucket next starts (``zero_grad(set_to_none=False)``, backward adding
into it) is not copied in either. Host float32 members are copied with one numpy call:
a torch op per member costs several times more for many small tensors, and each one
releases the GIL to the communication thread.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ...compressors.spec import CodecSpec
from ...torch.compression import Compression
from ...torch.dtypes import HALVES, dtype_name
from ..comm import Comm
from . import Route, drain


_NOT_COMPRESSED = object()  # a bucket's compression ctx where the tensor-level compression was not applied


class Bucket(Route):
    """Members' tensors fused into one push_pull named ``name``.

    Args:
        spec: the buffer's codec (None: uncompressed).
        lr_of: a member's learning rate (the first member's travels with a compressed push).
        carry: error feedback handed over from a previous plan, by member id: added to that
            member's next tensor, once (shared with the other buckets of the plan).
    """
    kind = "bucket"

    def __init__(self, name: str, members: list[torch.Tensor], spec: CodecSpec | None, priority: int,
                 comm: Comm, lr_of: Callable[[torch.Tensor], float] | None = None, views: bool = False,
                 compression=Compression.none, carry: dict[int, torch.Tensor] | None = None):
        super().__init__(members)
        self.name, self.spec, self.priority = name, spec, priority
        self.comm, self.lr_of, self.views, self.compression = comm, lr_of, views, compression
        self.carry = carry if carry is not None else {}
        self.buffer: torch.Tensor | None = None
        self._given: dict[int, torch.Tensor] = {}
        self._handle: tuple[int, object] | None = None   # (push_pull handle, compression ctx)
        self._in_place = False   # this step's tensor travels in its own memory (a bucket of one)
        self._made_on: dict[int, torch.cuda.Stream] = {}   # by member id: the stream current at its hand-over

    @property
    def fused(self) -> bool:
        return len(self.members) > 1

    @property
    def started(self) -> bool:
        return self._handle is not None

    def submit(self, p: torch.Tensor, tensor: torch.Tensor) -> None:
        self._given[id(p)] = tensor
        if tensor.is_cuda:  # the stream that made it (autograd runs a hook on its node's stream)
            self._made_on[id(p)] = torch.cuda.current_stream(tensor.device)
        if len(self._given) == len(self.members):
            self._start()

    def flush(self) -> None:
        if not self.started:
            self._start()

    def _start(self) -> None:
        missing = [p for p in self.members if id(p) not in self._given]
        if missing:
            raise RuntimeError(f"bucket {self.name!r}: {len(missing)} member(s) have no tensor this step")
        tensors = [self._given[id(p)] for p in self.members]
        made_on, self._made_on = self._made_on, {}
        _after_producers(made_on.values())
        with torch.no_grad():
            for p, t in zip(self.members, tensors):
                extra = self.carry.pop(id(p), None)
                if extra is not None:
                    t.add_(extra.to(t.device, t.dtype).view_as(t))
            self._in_place = not self.fused and tensors[0].dtype == self._buffer_dtype(tensors)
            flat = tensors[0] if self._in_place else self._fill(tensors)
        sent, ctx = self.compression.compress(flat)
        if sent is not flat and sent.dtype in HALVES and any(t.dtype != flat.dtype for t in tensors) \
                and (self.spec is not None or any(t.dtype == torch.bfloat16 for t in tensors)):
            # the buffer widened half members (for the codec, or beside float32 ones): narrowed
            # to float16 it would lose the codec that the direct route keeps for a half tensor,
            # and overflow bfloat16 members past 65504, which Compression.fp16 leaves as they are
            sent, ctx = flat, _NOT_COMPRESSED
        spec = self.spec if self.spec is not None and self.spec.accepts(dtype_name(sent.dtype)) else None
        lr = self.lr_of(self.members[0]) if spec is not None and self.lr_of is not None else None
        self._handle = (self.comm.start(sent, self.name, priority=self.priority, spec=spec, lr=lr), ctx)

    def _buffer_dtype(self, tensors: list[torch.Tensor]) -> torch.dtype:
        """The members' dtype; float32 where they differ, or a codec takes half-precision ones."""
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) > 1 or (self.spec is not None and dtypes & set(HALVES)):
            return torch.float32
        return tensors[0].dtype

    def _fill(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        if self.buffer is None:
            self.buffer = torch.empty(sum(t.numel() for t in tensors), dtype=self._buffer_dtype(tensors),
                                      device=tensors[0].device)
        if self.views and self._in_views(tensors):
            return self.buffer  # backward accumulated into the buffer itself
        if self.views and any(_shares_memory(t, self.buffer) for t in tensors):
            # some still its slice, some new (a p.grad replaced, create_graph): the others
            # go into their slices (a cat into the buffer must not read the buffer)
            kept = [(t, part) for t, part in zip(tensors, self.split(self.buffer)) if t.data_ptr() != part.data_ptr()
                    or t.dtype != part.dtype or not t.is_contiguous()]
            _copy_all([part for _, part in kept], [t.clone() if _shares_memory(t, self.buffer) else t for t, _ in kept])
            return self.buffer
        if _host_float32(tensors) and self.buffer.device.type == "cpu":
            np.concatenate([t.numpy().reshape(-1) for t in tensors], out=self.buffer.numpy())
        else:  # one batched copy (on a GPU one launch for the group, not one per member)
            torch.cat([t.detach().reshape(-1) for t in tensors], out=self.buffer)
        return self.buffer

    def finish(self, p: torch.Tensor | None = None) -> dict[int, torch.Tensor]:
        if self._handle is None:  # (finished already this step: finish_one took it)
            return {}
        (handle, ctx), self._handle = self._handle, None
        given, self._given = self._given, {}
        result = self.comm.wait(handle)
        into = getattr(self.compression, "decompress_into", None)  # (Compression.fp16's: the cast back)
        if ctx is _NOT_COMPRESSED:
            out = result
        elif ctx is not None and into is not None and self.buffer is not None and not self._in_place:
            out = into(result, ctx, self.buffer)
        else:
            out = self.compression.decompress(result, ctx)
        tensors = [given[id(q)] for q in self.members]
        if self._in_place:
            return {id(self.members[0]): out}
        if self.views and out is self.buffer and all(q.is_contiguous() and t.dtype == out.dtype
                                                     for q, t in zip(self.members, tensors)):
            return dict(zip((id(q) for q in self.members), self.split(out)))
        if _host_float32(tensors) and out.device.type == "cpu" and out.dtype == torch.float32:
            flat, offset = out.numpy(), 0
            for t in tensors:
                view = t.numpy()  # the tensor's own memory, strided or not
                np.copyto(view, flat[offset:offset + view.size].reshape(view.shape))
                offset += view.size
        else:
            with torch.no_grad():
                _copy_all(tensors, self.split(out))
        return {id(q): t for q, t in zip(self.members, tensors)}

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """A tensor laid out like the buffer, as its members' parts (views, in their shapes)."""
        parts, offset = [], 0
        for q in self.members:
            parts.append(flat[offset:offset + q.numel()].view(q.shape))
            offset += q.numel()
        return parts

    def clear(self) -> None:
        started, self._given, self._handle, self._made_on = self._handle, {}, None, {}
        drain([started[0]] if started is not None else [], self.comm)

    def _in_views(self, tensors: list[torch.Tensor]) -> bool:
        """Whether every tensor is still the slice of the buffer that ``finish`` handed out."""
        base, offset, size = self.buffer.data_ptr(), 0, self.buffer.element_size()
        for t in tensors:
            if t.dtype != self.buffer.dtype or not t.is_contiguous() or t.data_ptr() != base + size * offset:
                return False
            offset += t.numel()
        return True


def _after_producers(streams) -> None:
    """The bucket's copies, and the producer event of its push, come on the stream current at
    its last member's hand-over: where other members were made on other streams (a model's
    branches under ``torch.cuda.stream``), that stream first waits for theirs, on the device."""
    for made in set(streams):
        current = torch.cuda.current_stream(made.device)
        if made != current:
            current.wait_stream(made)


def _copy_all(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``targets[i][:] = sources[i]`` for all i: torch's multi-tensor copy where there is one
    (a few launches for a whole group on a GPU), one call per dtype and device of the
    targets. CUDA's multi-tensor copy took its kernel from the first target's dtype in some
    torch releases (pytorch#173531): a float32 group buffer copied out to float32 and
    bfloat16 members together would write 4-byte values into the bfloat16 ones."""
    copy_all = getattr(torch, "_foreach_copy_", None)
    if copy_all is None:
        for t, part in zip(targets, sources):
            t.copy_(part)
        return
    kinds: dict = {}
    for t, part in zip(targets, sources):
        pair = kinds.setdefault((t.dtype, t.device), ([], []))
        pair[0].append(t)
        pair[1].append(part)
    for ts, parts in kinds.values():
        copy_all(ts, parts)


def _shares_memory(t: torch.Tensor, buffer: torch.Tensor) -> bool:
    return t.device == buffer.device and t.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()


def _host_float32(tensors: list[torch.Tensor]) -> bool:
    """Whether numpy can copy these tensors: float32, strided, in host memory."""
    return all(t.dtype == torch.float32 and t.device.type == "cpu" and t.layout == torch.strided
               and not t.requires_grad for t in tensors)
