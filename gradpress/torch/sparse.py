"""Row-sparse push_pull from torch: sparse COO tensors, and dense gradients that are
mostly zero rows.

A sparse COO tensor with one sparse dimension (what ``nn.Embedding(sparse=True)`` and
``nn.EmbeddingBag(sparse=True)`` give as gradients) travels as its rows: duplicates
summed (torch's coalescing, in the order given), split over the servers by the row
hash, and the result is the coalesced union over every worker. A dense tensor of 2+
dimensions can travel the same way (``dense_rows=True``): its non-zero rows are found
(a numba.cuda kernel on GPU tensors, Numba on CPU ones) and the union is written back
into a dense output, zero elsewhere. A GPU gradient's rows are found off the thread that
hands it over (``handed_over``, ``worker/row_finder.py``): finding them waits for the device.

Values travel in the tensor's dtype (float16 after ``Compression.fp16``: summed in
float32 on the servers, rounded once). No error feedback: the row sum is exact, and
fp16's rounding of a row is not carried to the next step.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from ..row_placement import RowLayout
from ..worker import WorkerClient
from ..worker.future import Future
from ..worker.sparse import SparseRows, coalesce, extract
from .dtypes import wire_dtype



def is_row_sparse(tensor: torch.Tensor) -> bool:
    return tensor.layout == torch.sparse_coo


def travels_as_rows(tensor: torch.Tensor, name: str) -> bool:
    """Whether a push_pull of ``tensor`` sends its rows (sparse COO) rather than its values
    (a dense, strided tensor); other layouts (CSR, CSC, blocked, MKL-DNN) are refused."""
    if tensor.layout not in (torch.strided, torch.sparse_coo):
        raise ValueError(f"push_pull of {name!r}: a {tensor.layout} tensor; dense (strided) or sparse COO "
                         f"tensors expected (tensor.to_sparse_coo() or tensor.to_dense() converts it)")
    return is_row_sparse(tensor)


def layout_of(tensor: torch.Tensor, client: WorkerClient, seed: int) -> RowLayout:
    width = math.prod(tensor.shape[1:]) if tensor.dim() > 1 else 1
    return RowLayout(int(tensor.shape[0]), int(width), seed, client.book.num_servers)


def _wire(tensor: torch.Tensor, name: str) -> torch.dtype:
    wire = wire_dtype(tensor.dtype)
    if wire is None:
        raise ValueError(f"push_pull of {name!r}: a row-sparse {tensor.dtype} tensor; "
                         f"float16, bfloat16, float32 or float64 expected")
    return wire


def _numpy_wire(wire: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=wire).numpy().dtype


def rows_of_coo(tensor: torch.Tensor, name: str) -> SparseRows | Callable[[], SparseRows]:
    """A sparse COO tensor's rows, coalesced (duplicate indices summed in order); for a
    CUDA tensor, a function that finds them (``handed_over``)."""
    if tensor.sparse_dim() != 1:
        raise ValueError(f"push_pull of {name!r}: a sparse COO tensor with {tensor.sparse_dim()} sparse "
                         f"dimensions; row-sparse tensors have 1 (an embedding's gradient)")
    t = tensor.detach()
    wire = _wire(t, name)

    def find() -> SparseRows:
        indices = t._indices()[0].to("cpu").numpy()
        width = math.prod(t.shape[1:]) if t.dim() > 1 else 1
        values = t._values().to("cpu", wire).reshape(indices.shape[0], width).numpy()
        return coalesce(indices, values, int(t.shape[0]), f"push_pull of {name!r}")
    return handed_over(t, find) if t.is_cuda else find()


def dense_rows(tensor: torch.Tensor, name: str) -> SparseRows | Callable[[], SparseRows]:
    """The non-zero rows of a dense tensor of 2+ dimensions (viewed as rows x width); for a
    CUDA tensor, a function that finds them (``handed_over``), so that the thread handing the
    gradient over never waits."""
    t = tensor.detach()
    wire = _wire(t, name)
    if t.dim() < 2:
        raise ValueError(f"push_pull of {name!r}: a dense tensor travels row-sparse only with 2+ dimensions")
    if not t.is_cuda:
        return extract(t.to("cpu", wire).reshape(t.shape[0], -1).contiguous().numpy())

    def find() -> SparseRows:
        if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return extract(t.to("cpu", wire).reshape(t.shape[0], -1).contiguous().numpy())
        # found on the device: only the rows come to the host (float16 and bfloat16 widen
        # exactly, and go back to the wire)
        from ..kernels.cuda import rows as cuda_rows
        indices, values = cuda_rows.nonzero_rows(t.reshape(t.shape[0], -1).float().contiguous())
        return SparseRows(indices, values.astype(_numpy_wire(wire), copy=False))
    return handed_over(t, find)


def handed_over(t: torch.Tensor, find: Callable[[], SparseRows]) -> Callable[[], SparseRows]:
    """``find`` of a CUDA gradient ``t``, to run later on another thread
    (``worker/row_finder.py``): an event recorded now on the caller's current stream orders
    its reads after the gradient's producer, on gradpress's stream of ``t``'s device (the
    finding waits for the device; the caller does not)."""
    from ..kernels.cuda import device
    ready = device.produced(t)

    def found() -> SparseRows:
        with device.working_on(t):  # torch's reads and copies too: ``t`` may come from a side stream
            device.wait_for(ready, t)
            return find()
    return found


def start(client: WorkerClient, tensor: torch.Tensor, rows: SparseRows | Callable[[], SparseRows], name: str,
          divisor: int, priority: int, seed: int, dense_out: torch.Tensor | None = None) -> tuple[Future, Callable]:
    """Start the sparse push_pull of ``rows`` (of ``tensor``'s shape); returns its future and
    a function that, once it is done, gives the result: a coalesced sparse COO tensor, or
    ``dense_out`` written (zero outside the union)."""
    layout = layout_of(tensor, client, seed)
    if callable(rows):  # a GPU gradient's: found on the row finder's thread
        future = client.push_pull_sparse_later(name, rows, layout, divisor, priority)
    else:
        future = client.push_pull_sparse_async(name, rows, layout, divisor, priority)

    def result() -> torch.Tensor:
        union = future.result(0).rows()
        indices = torch.from_numpy(union.indices)
        values = torch.from_numpy(np.ascontiguousarray(union.values))
        with torch.no_grad():
            if dense_out is not None:  # indexed by rows as it is: a channels_last one has no flat view
                dense_out.zero_()
                dense_out[indices.to(dense_out.device)] = values.to(dense_out.device, dense_out.dtype).reshape(
                    (values.shape[0],) + tuple(dense_out.shape[1:]))
                return dense_out
            values = values.reshape((values.shape[0],) + tuple(tensor.shape[1:])).to(tensor.dtype)
            return torch.sparse_coo_tensor(indices.unsqueeze(0), values, tuple(tensor.shape),
                                           is_coalesced=True, check_invariants=False).to(tensor.device)
    return future, result
