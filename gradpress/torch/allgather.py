"""allgather: every worker gets the concatenation, in rank order, of every worker's tensor.

A parameter server only sums, so a gather is two sums: first every worker's first
dimension (a vector with each worker's count at its rank), then a buffer of the total
size in which each worker writes its rows at its offset and zeros elsewhere. Adding
zeros is exact in every float type, and integer tensors travel as float64 (exact below
2**53). Names carry the total size, so calls of a recurring shape reuse their keys.
"""
from __future__ import annotations

import pickle
from typing import Any

import torch

from . import ops
from .dtypes import wire_dtype
from .objects import MAX_OBJECT_BYTES, bytes_to_float16, float16_to_bytes



def allgather(tensor: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """Concatenate every worker's ``tensor`` along dimension 0, in rank order.

    First dimensions may differ between workers; the other dimensions and the dtype
    must agree. Returns a new tensor on ``tensor``'s device, of its dtype.
    """
    if tensor.dim() == 0:
        raise ValueError("allgather: a 0-d tensor has no first dimension to concatenate; use tensor.view(1)")
    name = name or "noname"
    rank, size = ops.rank(), ops.size()
    counts = torch.zeros(size, dtype=torch.float64)
    counts[rank] = tensor.shape[0]
    ops.push_pull_inplace(counts, average=False, name=f"Allgather.{name}.counts.{size}")
    rows = [int(c) for c in counts.tolist()]
    row_shape = tuple(tensor.shape[1:])
    row_elems = 1
    for d in row_shape:
        row_elems *= d
    wire = wire_dtype(tensor.dtype) or torch.float64
    total = sum(rows)
    buffer = torch.zeros(total * row_elems, dtype=wire)
    start = sum(rows[:rank]) * row_elems
    buffer[start:start + tensor.numel()] = tensor.detach().reshape(-1).to("cpu", wire)
    # the per-row shape is in the name: workers that disagree on it get a clear mismatch error
    shape_tag = "x".join(map(str, row_shape)) or "scalar"
    ops.push_pull_inplace(buffer, average=False, name=f"Allgather.{name}.{shape_tag}.{total}.{wire}")
    return buffer.view(total, *row_shape).to(tensor.device, tensor.dtype)


def allgather_object(obj: Any, name: str | None = None, max_bytes: int = MAX_OBJECT_BYTES) -> list[Any]:
    """Every worker's picklable ``obj``, as a list in rank order.

    The bytes come from the job's own push_pulls; objects larger than ``max_bytes``
    pickled are refused (by the sender, and by every receiver before it allocates).
    """
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if len(payload) > max_bytes:
        raise ValueError(f"allgather_object: this worker's object pickles to {len(payload)} bytes, "
                         f"over max_bytes={max_bytes}")
    name = name or "noname"
    size = ops.size()
    lengths = torch.zeros(size, dtype=torch.float64)
    lengths[ops.rank()] = len(payload)
    ops.push_pull_inplace(lengths, average=False, name=f"AllgatherObject.{name}.lengths.{size}")
    sizes = [int(n) for n in lengths.tolist()]
    if any(n < 0 or n > max_bytes for n in sizes) or sum(sizes) > max_bytes * size:
        raise ValueError(f"allgather_object: workers announced {sizes} bytes; the limit is "
                         f"max_bytes={max_bytes} each")
    gathered = allgather(bytes_to_float16(payload), name=f"Object.{name}")
    raw = float16_to_bytes(gathered)
    out, at = [], 0
    for n in sizes:
        out.append(pickle.loads(raw[at:at + n]))
        at += n
    return out
