"""Row-sparse push_pull on a worker: rows in, per-server shares out, the union back.

A sparse push_pull starts from ``SparseRows`` (sorted, distinct row indices and their
values: ``coalesce`` sums duplicates as torch's coalescing does, ``extract`` finds the
non-zero rows of a dense gradient). ``SparseShares`` splits them by the row hash into
one share per server, each still sorted; partition ``s`` of the tensor pushes share
``s`` to server ``s`` (the ``push_payload`` stage) and lands that server's union of every
worker's rows (the ``land`` stage), checked as a server checks a push. ``SparseResult``
collects the shares and gives the whole union, divided by the job's divisor.

Each share's "known" rows (every row its server has published for it) are kept here as
the server keeps them, so that a reply may name the round's rows by a bitmap over them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..kernels.cpu import rows as kernels
from ..row_placement import RowLayout

if TYPE_CHECKING:
    from .jobs import PartitionOp


@dataclass
class SparseRows:
    """Row indices (int64, strictly increasing) and their values, one row of ``width`` each."""
    indices: np.ndarray
    values: np.ndarray


def coalesce(indices: Any, values: Any, rows: int, what: str) -> SparseRows:
    """Sort rows by index and sum the rows of equal indices (in the order given).

    Raises:
        ValueError: an index outside ``[0, rows)``, or values that are not one row per index.
    """
    indices = np.ascontiguousarray(indices, np.int64).reshape(-1)
    values = np.ascontiguousarray(values)
    if values.ndim != 2 or values.shape[0] != indices.shape[0]:
        raise ValueError(f"{what}: {indices.shape[0]} row indices but values of shape {values.shape}")
    if indices.shape[0] and (indices.min() < 0 or indices.max() >= rows):
        bad = int(indices[(indices < 0) | (indices >= rows)][0])
        raise ValueError(f"{what}: row index {bad} is out of range for a table of {rows} rows")
    order = np.argsort(indices, kind="stable")
    out_idx = np.empty(indices.shape[0], np.int64)
    # Numba has no float16 arithmetic: float16 rows are summed in float32 and rounded once
    out_val = np.empty(values.shape, np.float32 if values.dtype == np.float16 else values.dtype)
    n = kernels.sum_runs(order, indices, values.astype(out_val.dtype, copy=False), out_idx, out_val)
    return SparseRows(out_idx[:n], out_val[:n].astype(values.dtype, copy=False))


def extract(dense: np.ndarray) -> SparseRows:
    """The rows of a 2-D array holding any non-zero value, and those rows."""
    if dense.dtype == np.float16:  # Numba has no float16: the same rows, found in float32
        rows = extract(dense.astype(np.float32))
        return SparseRows(rows.indices, rows.values.astype(np.float16))
    indices = np.empty(dense.shape[0], np.int64)
    n = kernels.nonzero_rows(dense, indices)
    values = np.empty((n, dense.shape[1]), dense.dtype)
    kernels.gather_rows(dense, indices[:n], values)
    return SparseRows(indices[:n], values)


class SparseShares:
    """A push_pull's rows split by owning server (``job.src`` of a sparse tensor)."""

    def __init__(self, rows: SparseRows, layout: RowLayout):
        offsets = np.empty(layout.num_servers + 1, np.int64)
        order = np.empty(rows.indices.shape[0], np.int64)
        kernels.split_by_owner(rows.indices, layout.stream, layout.num_servers, offsets, order)
        self.shares = []
        for s in range(layout.num_servers):
            take = order[offsets[s]:offsets[s + 1]]
            self.shares.append((rows.indices[take].astype(layout.index_dtype),
                                np.ascontiguousarray(rows.values[take])))


class SparseResult:
    """Every server's union, landed share by share (``job.out`` of a sparse tensor)."""

    def __init__(self, layout: RowLayout, dtype: str, divisor: int):
        self.layout, self.dtype, self.divisor = layout, dtype, divisor
        self.shares: list[tuple[np.ndarray, np.ndarray] | None] = [None] * layout.num_servers

    def rows(self) -> SparseRows:
        """The union over all servers: sorted indices, values divided by the divisor."""
        indices = np.concatenate([s[0] for s in self.shares]).astype(np.int64)
        values = np.concatenate([s[1] for s in self.shares]) if indices.shape[0] \
            else np.empty((0, self.layout.width), self.dtype)
        order = np.argsort(indices, kind="stable")
        values = values[order]
        if self.divisor != 1:
            values = (values / self.divisor).astype(self.dtype, copy=False)
        return SparseRows(indices[order], values)


def push_payload(op: "PartitionOp") -> tuple[dict, list]:
    """Share ``op``'s partition index of the job's rows: header fields and its two frames."""
    indices, values = op.job.src.shares[op.wkey.index]
    return {"sparse": True, "count": int(indices.shape[0])}, [indices, values]


def land(op: "PartitionOp", h: dict, frames: list) -> None:
    """Check a server's union for share ``op.wkey.index`` and keep it in the job's result.

    Raises:
        ValueError: the reply does not fit the layout or this worker's known rows.
    """
    t, share = op.job.tensor, op.wkey.index
    layout: RowLayout = t.layout
    n, width, idt = h["count"], layout.width, layout.index_dtype
    if h["dtype"] != t.dtype or h.get("sparse") not in ("rows", "bitmap") or n > layout.rows:
        raise ValueError(f"a sparse reply of {n} {h['dtype']} rows ({h.get('sparse')!r}); expected at most "
                         f"{layout.rows} {t.dtype} rows as 'rows' or 'bitmap'")
    bufs = [f.buffer if hasattr(f, "buffer") else f for f in frames]
    known = t.known[share]
    if h["sparse"] == "rows":
        if len(bufs) != 2 or len(bufs[0]) != n * idt.itemsize:
            raise ValueError(f"expected 2 frames and {n * idt.itemsize} bytes of indices")
        indices = np.frombuffer(bufs[0], idt)
    else:
        if h.get("known") != known.shape[0]:
            raise ValueError(f"a bitmap over {h.get('known')} known rows; this worker knows {known.shape[0]}")
        if len(bufs) != 3 or len(bufs[0]) != (known.shape[0] + 7) // 8 or len(bufs[1]) % idt.itemsize:
            raise ValueError("a bitmap reply needs 3 frames: the bitmap over the known rows, new indices, values")
        indices = np.empty(n, idt)
        got = kernels.from_bitmap(known, np.frombuffer(bufs[0], np.uint8), np.frombuffer(bufs[1], idt), indices)
        if got != n:
            raise ValueError(f"the bitmap and new indices name {'more than' if got < 0 else got} rows, not {n}")
    code, at = kernels.check_rows(indices, layout.rows, layout.stream, layout.num_servers, share)
    if code != kernels.ROWS_OK:
        raise ValueError(f"row index {int(indices[at])} at position {at} is out of range, unsorted or "
                         f"not owned by server {share}")
    if len(bufs[-1]) != n * width * np.dtype(t.dtype).itemsize:
        raise ValueError(f"{len(bufs[-1])} bytes of values for {n} rows of width {width}")
    merged = np.empty(known.shape[0] + n, idt)
    t.known[share] = merged[:kernels.union(known, indices, merged)]
    op.job.out.shares[share] = (indices.copy(), np.frombuffer(bufs[-1], t.dtype).reshape(n, width).copy())
