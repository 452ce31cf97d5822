"""allgather: every worker gets the concatenation, in rank order, of every worker's tensor.

A parameter server only sums, so a gather is two sums: first every worker's first
dimension (a vector with each worker's count at its rank, and a digest of its row shape
and dtype, so that workers that disagree fail at once), then a buffer of the total size
in which each worker writes its rows at its offset and negative zeros elsewhere. Adding
-0.0 is exact in every float type, the sign of a zero included (+0.0 turned -0.0 into
+0.0); narrow integers travel as float64, 64-bit ones as their 32-bit words and complex
tensors as their real and imaginary parts, all exact. Names carry the total size rounded
up to four significant bits (``objects.padded``, the buffer padded to it), so calls of a
recurring shape reuse their keys, and calls whose totals vary take few.
"""
from __future__ import annotations

import hashlib
import pickle
from typing import Any

import torch

from . import ops
from .dtypes import wire_dtype
from .objects import MAX_OBJECT_BYTES, ObjectError, bytes_to_float16, float16_to_bytes, padded, unpickled


class _Allgather(torch.autograd.Function):
    """allgather as an autograd function, as in BytePS: the gradient of a worker's rows is
    its slice of the average, over workers, of the gradients every worker's output got."""

    @staticmethod
    def forward(ctx, tensor, name, priority):
        gathered, rows = _gather(tensor, name, priority)
        ctx.name, ctx.priority, ctx.rows = name, priority, rows
        return gathered

    @staticmethod
    def backward(ctx, grad_output):
        # padded as the forward's buffer, its size and dtype in its name: a later call of
        # another total (an epoch's last, smaller batch) has keys of its own, and few
        total, room = grad_output.shape[0], padded(grad_output.shape[0], bits=4)
        grad = torch.cat([grad_output, grad_output.new_zeros(room - total, *grad_output.shape[1:])])
        shape = "x".join(map(str, grad.shape))
        reduced = ops.push_pull(grad, average=True, priority=ctx.priority,
                                name=f"Allgather.{ctx.name}.grad.{shape}.{str(grad.dtype).removeprefix('torch.')}")
        rank = ops.rank()
        return reduced.narrow(0, sum(ctx.rows[:rank]), ctx.rows[rank]), None, None


def allgather(tensor, same_shape=True, name: str | None = None, version: int = 0, priority: int = 0):
    """Concatenate every worker's ``tensor`` along dimension 0, in rank order (BytePS's
    ``allgather``; differentiable).

    First dimensions may differ between workers; the other dimensions and the dtype must
    agree. ``same_shape`` is BytePS's hint that they are all equal; gradpress exchanges the
    first dimensions either way (one tiny push_pull), so uneven ones are gathered right
    whatever it says. ``version`` is accepted for BytePS.
    torch.distributed's form, ``allgather(outputs, tensor)``, fills the list ``outputs``
    with every worker's tensor, in rank order, and returns it. A 0-d tensor is gathered as
    one element, as BytePS does. Returns a new tensor on ``tensor``'s device, of its dtype.

    Raises:
        ValueError: an output list of the wrong length or shapes.
    """
    if isinstance(tensor, (list, tuple)):  # allgather(outputs, tensor)
        return _into(tensor if isinstance(tensor, list) else list(tensor), same_shape, name, priority)
    if isinstance(same_shape, str):  # gradpress's earlier allgather(tensor, name)
        name, same_shape = same_shape, True
    if tensor.dim() == 0:
        tensor = tensor.unsqueeze(0)
    name = name or "noname"
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Allgather.apply(tensor, name, priority)
    return _gather(tensor, name, priority)[0]


def _into(outputs: list, tensor, name: str | None, priority: int) -> list:
    if not torch.is_tensor(tensor):
        raise ValueError("allgather(outputs, tensor): the second argument must be this worker's tensor")
    if len(outputs) != ops.size():
        raise ValueError(f"allgather(outputs, tensor): {len(outputs)} outputs for {ops.size()} workers")
    gathered, rows = _gather(tensor.unsqueeze(0) if tensor.dim() == 0 else tensor, name or "noname", priority)
    at = 0
    for rank, (out, n) in enumerate(zip(outputs, rows)):
        part = gathered[at:at + n].view(tensor.shape) if tensor.dim() == 0 else gathered[at:at + n]
        if tuple(out.shape) != tuple(part.shape):
            raise ValueError(f"allgather(outputs, tensor): outputs[{rank}] has shape {tuple(out.shape)}, "
                             f"worker {rank} sent {tuple(part.shape)}")
        with torch.no_grad():
            out.copy_(part)
        at += n
    return outputs


def _gather(tensor: torch.Tensor, name: str, priority: int,
            described: str | None = None) -> tuple[torch.Tensor, list[int]]:
    """The concatenation, and each worker's first dimension. ``described``: the rows and
    dtype the caller gathers, where ``tensor`` is a view of them in another dtype."""
    described = described or f"rows of {tuple(tensor.shape[1:])} {str(tensor.dtype).removeprefix('torch.')}"
    if tensor.is_complex():  # its real and imaginary parts, each gathered exactly
        gathered, rows = _gather(torch.view_as_real(tensor.resolve_conj().resolve_neg()), name, priority, described)
        return torch.view_as_complex(gathered), rows
    if tensor.dtype in (torch.int64, torch.uint64):  # its 32-bit words: float64 is exact for those only
        # the last dimension doubles (flat first: a "contiguous" tensor may have a last stride
        # other than 1, where its dimension is 1, which view(dtype) refuses)
        words = tensor.reshape(-1).view(torch.int32).view(*tensor.shape[:-1], 2 * tensor.shape[-1])
        gathered, rows = _gather(words, name, priority, described)
        return gathered.view(tensor.dtype), (rows if tensor.dim() > 1 else [r // 2 for r in rows])
    rank = ops.rank()
    row_shape = tuple(tensor.shape[1:])
    rows = _exchange_counts(tensor.shape[0], described, name, priority)
    row_elems = 1
    for d in row_shape:
        row_elems *= d
    wire = wire_dtype(tensor.dtype) or torch.float64
    total, room = sum(rows), padded(sum(rows), bits=4)
    buffer = torch.full((room * row_elems,), -0.0, dtype=wire)
    start = sum(rows[:rank]) * row_elems
    buffer[start:start + tensor.numel()] = tensor.detach().reshape(-1).to("cpu", wire)
    # the per-row shape is in the name: workers that disagree on it get a clear mismatch error
    shape_tag = "x".join(map(str, row_shape)) or "scalar"
    ops.push_pull_inplace(buffer, average=False, name=f"Allgather.{name}.{shape_tag}.{room}.{wire}",
                          priority=priority)
    return buffer[:total * row_elems].view(total, *row_shape).to(tensor.device, tensor.dtype), rows


def _exchange_counts(count: int, described: str, name: str, priority: int) -> list[int]:
    """Every worker's first dimension, in one push_pull that also carries a digest of each
    worker's row shape and dtype (``described``): workers that disagree fail at once, naming
    each other (their gathers would have different keys and wait out GRADPRESS_OP_TIMEOUT_S)."""
    rank, size = ops.rank(), ops.size()
    digest = int.from_bytes(hashlib.blake2b(described.encode(), digest_size=6).digest(), "little")
    slots = torch.zeros(2 * size, dtype=torch.float64)  # 48-bit digests: exact in float64
    slots[rank], slots[size + rank] = count, digest
    ops.push_pull_inplace(slots, average=False, name=f"Allgather.{name}.counts.{size}", priority=priority)
    differ = [w for w in range(size) if int(slots[size + w]) != digest]
    if differ:
        raise ValueError(f"allgather of {name!r}: worker(s) {differ} gather other row shapes or another dtype "
                         f"than this worker's (rank {rank}) {described}; all but the first dimension, and "
                         f"the dtype, must agree")
    return [int(c) for c in slots[:size].tolist()]


def allgather_object(obj: Any, name: str | None = None, max_bytes: int = MAX_OBJECT_BYTES) -> list[Any]:
    """Every worker's picklable ``obj``, as a list in rank order.

    The bytes come from the job's own push_pulls; objects larger than ``max_bytes``
    pickled are refused (by the sender, and by every receiver before it allocates).

    Raises:
        ObjectError: on every worker, when a worker's object does not pickle or is too
            large. A worker that failed alone would leave the others pairing this call
            with its next one: it announces the failure (length -1) instead. On a
            worker where another's object does not unpickle, naming that worker.
    """
    error = None
    try:
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 - pickling raises many types; all end the same way
        payload, error = b"", f"the object ({type(obj).__name__}) does not pickle: {type(e).__name__}: {e}"
    if error is None and len(payload) > max_bytes:
        error = f"the object pickles to {len(payload)} bytes, over max_bytes={max_bytes}"
    name = name or "noname"
    size = ops.size()
    lengths = torch.zeros(size, dtype=torch.float64)
    lengths[ops.rank()] = -1 if error else len(payload)
    ops.push_pull_inplace(lengths, average=False, name=f"AllgatherObject.{name}.lengths.{size}")
    sizes = [int(n) for n in lengths.tolist()]
    failed = [w for w, n in enumerate(sizes) if n == -1]
    if failed:
        raise ObjectError(f"allgather_object: worker(s) {failed} could not send their object"
                          + (f"; here, {error}" if error else ""))
    if any(n < 0 or n > max_bytes for n in sizes) or sum(sizes) > max_bytes * size:
        raise ValueError(f"allgather_object: workers announced {sizes} bytes; the limit is "
                         f"max_bytes={max_bytes} each")
    each = padded(max(sizes))  # every worker's bytes padded alike: few sizes, so few keys
    raw = float16_to_bytes(allgather(bytes_to_float16(payload, each), name=f"Object.{name}"))
    return [unpickled(raw[w * each:w * each + n], f"worker {w}") for w, n in enumerate(sizes)]
