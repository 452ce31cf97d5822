"""The low-rank steps' arithmetic: Numba kernels on CPU tensors, torch ops elsewhere (a GPU's)."""
from __future__ import annotations

import numpy as np
import torch

from ..kernels.cpu import lowrank as kernels


class NumbaMath:
    """The steps on CPU tensors, through the Numba kernels (one pass over M and E per product)."""

    @staticmethod
    def factor_rows(m, e, qt, p, add_m: bool, subtract: bool) -> None:
        kernels.factor_rows(_np(m if m is not None else e), _np(e), _np(qt), _np(p), add_m, subtract)

    @staticmethod
    def factor_cols(m, e, p, qt, add_m: bool) -> None:
        kernels.factor_cols(_np(m if m is not None else e), _np(e), _np(p), _np(qt), add_m)

    @staticmethod
    def subtract_product(m, e, p, qt, add_m: bool) -> None:
        kernels.subtract_product(_np(m if m is not None else e), _np(e), _np(p), _np(qt), add_m)

    @staticmethod
    def reconstruct(p, qt, scale: float, out) -> None:
        kernels.reconstruct(_np(p), _np(qt), scale, _np(out))

    @staticmethod
    def orthonormalize(flat, layout, by_rows: bool) -> None:
        kernels.orthonormalize(_np(flat), *layout, by_rows)


class TorchMath:
    """The same steps as torch ops, on the tensors' own device (a GPU worker's)."""

    @staticmethod
    def factor_rows(m, e, qt, p, add_m: bool, subtract: bool) -> None:
        if add_m:
            e.add_(m)
        torch.mm(e, qt.t(), out=p)
        if subtract:
            e.addmm_(p, qt, alpha=-1)

    @staticmethod
    def factor_cols(m, e, p, qt, add_m: bool) -> None:
        torch.mm(p.t(), e + m if add_m else e, out=qt)

    @staticmethod
    def subtract_product(m, e, p, qt, add_m: bool) -> None:
        if add_m:
            e.add_(m)
        e.addmm_(p, qt, alpha=-1)

    @staticmethod
    def reconstruct(p, qt, scale: float, out) -> None:
        torch.mm(p, qt, out=out)
        out.mul_(scale)

    @staticmethod
    def orthonormalize(flat, layout, by_rows: bool) -> None:
        """Modified Gram-Schmidt per matrix, as the kernel: zero or dependent vectors become zero."""
        for base, n, r in zip(*layout):
            base, n, r = int(base), int(n), int(r)
            block = flat[base:base + n * r]
            vectors = block.view(r, n) if by_rows else block.view(n, r).t()
            for k in range(r):
                v = vectors[k]
                before = torch.linalg.vector_norm(v.double())
                for j in range(k):
                    v.sub_(torch.dot(v.double(), vectors[j].double()).float() * vectors[j])
                norm = torch.linalg.vector_norm(v.double())
                keep = (norm > 0) & (norm > kernels.DEPENDENT * before)
                v.copy_(torch.where(keep, v * torch.where(keep, 1.0 / norm, 0.0).float(), torch.zeros_like(v)))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()
