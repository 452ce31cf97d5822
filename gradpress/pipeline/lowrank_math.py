"""The low-rank steps' arithmetic: Numba kernels on CPU tensors, torch ops elsewhere (a GPU's)."""
from __future__ import annotations

import numpy as np
import torch

from ..kernels.cpu import lowrank as kernels


class NumbaMath:
    """The steps on CPU tensors, through the Numba kernels (one pass over M and E per product).

    Every step takes lists, one entry per matrix (``ms`` None: no M): M (the gradients), E
    (the error buffers), P and Q^T (views of the flat factors), the outputs."""

    @staticmethod
    def factor_rows(ms, es, qts, ps, add_m: bool, subtract: bool) -> None:
        for m, e, qt, p in zip(ms or es, es, qts, ps):
            kernels.factor_rows(_np(m), _np(e), _np(qt), _np(p), add_m, subtract)

    @staticmethod
    def factor_cols_subtract(ms, es, ps, qts, add_m: bool) -> None:
        """Q^T = P^T X, then E = X - P Q^T, for X = E (+ M when ``add_m``): a matrix's two
        passes one after the other, while it is still in the cache."""
        for m, e, p, qt in zip(ms or es, es, ps, qts):
            kernels.factor_cols(_np(m), _np(e), _np(p), _np(qt), add_m)
            kernels.subtract_product(_np(m), _np(e), _np(p), _np(qt), add_m)

    @staticmethod
    def reconstruct(ps, qts, scale: float, outs) -> None:
        for p, qt, out in zip(ps, qts, outs):
            kernels.reconstruct(_np(p), _np(qt), scale, _np(out))

    @staticmethod
    def orthonormalize(flat, layout, by_rows: bool) -> None:
        kernels.orthonormalize(_np(flat), *layout, by_rows)


class TorchMath:
    """The same steps as torch ops, on the tensors' own device (a GPU worker's). On a GPU each
    op is a launch and its Python on the step's thread, so what is element-wise goes through
    torch's multi-tensor ops, one for every matrix (``torch._foreach_*``, the same arithmetic
    as the op on each)."""

    @staticmethod
    def factor_rows(ms, es, qts, ps, add_m: bool, subtract: bool) -> None:
        if add_m and es:
            torch._foreach_add_(es, ms)
        for e, qt, p in zip(es, qts, ps):
            torch.mm(e, qt.t(), out=p)
            if subtract:
                e.addmm_(p, qt, alpha=-1)

    @staticmethod
    def factor_cols_subtract(ms, es, ps, qts, add_m: bool) -> None:
        if add_m and es:
            torch._foreach_add_(es, ms)   # E holds X from here on, as it will after
        for e, p, qt in zip(es, ps, qts):
            torch.mm(p.t(), e, out=qt)
            e.addmm_(p, qt, alpha=-1)

    @staticmethod
    def reconstruct(ps, qts, scale: float, outs) -> None:
        for p, qt, out in zip(ps, qts, outs):
            torch.mm(p, qt, out=out)
        if outs:
            torch._foreach_mul_(outs, scale)

    @staticmethod
    def orthonormalize(flat, layout, by_rows: bool) -> None:
        """Modified Gram-Schmidt on every matrix at once, as the kernel does one by one (dots
        and norms in float64, a zero or dependent vector zeroed, a NaN kept). The matrices'
        vectors are gathered into zero-padded batches (``_batches``), and each step of the
        method runs on a whole batch. On a GPU every op is a launch and its Python on the
        step's thread: the benchmark transformer's 33 matrices at rank 4 take 107 ops there,
        where one matrix at a time took 3,433 (``benchmarks/lowrank_kernels.py``). Padding changes
        nothing: zeros add nothing to a dot or a norm, and a padded vector (a matrix of lower
        rank) stays zero. Every worker runs the same batches, so the factors stay identical
        across them."""
        for index, valid, to in _batches(flat, layout, by_rows):
            vectors = torch.nn.functional.pad(flat, (0, 1))[index]   # (rank, matrices, length)
            for k in range(vectors.shape[0]):
                v = vectors[k]
                before = torch.linalg.vector_norm(v.double(), dim=1)
                for j in range(k):
                    u = vectors[j]
                    v.sub_((v.double() * u.double()).sum(1).float()[:, None] * u)
                norm = torch.linalg.vector_norm(v.double(), dim=1)
                zero = (norm == 0) | (norm <= kernels.DEPENDENT * before)
                v.copy_(torch.where(zero[:, None], 0.0, v * (1.0 / norm).float()[:, None]))
            flat[to] = vectors.reshape(-1)[valid]


# gather plans by (device, buffer length, by_rows, layout): a reducer asks for the same two every step
_plans: dict[tuple, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
# Elements a single padded batch of every matrix may hold, by device type (others: GPU_BUDGET).
# On a GPU each op costs a launch and its Python, and a few million elements cost the card
# microseconds: one batch. On a host the padding is arithmetic: a batch per power of two.
GPU_BUDGET = 1 << 22
PAD_BUDGET = {"cpu": 0}


def _batches(flat, layout, by_rows: bool) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per batch of matrices (all of them where padded to the longest they fit
    ``PAD_BUDGET``, else those whose vectors' lengths share a power of two, so that padding
    at most doubles a batch): the index into the flat buffer, with a zero past its end, of
    each (vector, matrix, element) padded to the batch's largest rank and length; the
    positions in that batch that hold a matrix's element; and those elements' places in
    the buffer."""
    offsets, lengths, ranks = (np.asarray(a, np.int64) for a in layout)
    end = flat.numel()   # the padded buffer's zero
    budget = PAD_BUDGET.get(flat.device.type, GPU_BUDGET)
    key = (str(flat.device), end, by_rows, budget, offsets.tobytes(), lengths.tobytes(), ranks.tobytes())
    plan = _plans.get(key)
    if plan is not None:
        return plan
    if len(lengths) and len(lengths) * int(ranks.max()) * int(lengths.max()) <= budget:
        classes = np.zeros(len(lengths), np.int64)
    else:
        classes = np.ceil(np.log2(np.maximum(lengths, 1))).astype(np.int64)
    plan = []
    for c in np.unique(classes):
        members = np.flatnonzero(classes == c)
        rank, length = int(ranks[members].max()), int(lengths[members].max())
        k, i = np.arange(rank)[:, None], np.arange(length)[None, :]
        index = np.full((rank, len(members), length), end, np.int64)   # (the zero after the buffer)
        for b, t in enumerate(members):
            n, r = int(lengths[t]), int(ranks[t])
            index[:r, b, :n] = offsets[t] + (k[:r] * n + i[:, :n] if by_rows else i[:, :n] * r + k[:r])
        valid = np.flatnonzero(index.reshape(-1) != end)
        plan.append(tuple(torch.from_numpy(a).to(flat.device) for a in (index, valid, index.reshape(-1)[valid])))
    if len(_plans) > 64:   # (reducers come and go: a new plan's)
        _plans.clear()
    _plans[key] = plan
    return plan


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()
