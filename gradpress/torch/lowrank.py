"""PowerSGD and ACP-SGD on the workers: factors pushed and pulled as plain float32 sums.

A ``LowRankReducer`` averages a fixed set of tensors (a model's gradients, or OneBitAdam's
momenta) once per step. Each tensor of 2+ dimensions that is worth it
(``LowRankParams.compresses``, at least BYTEPS_MIN_COMPRESS_BYTES) is an n x m matrix M_i
with an error buffer E_i on worker i; the others (1-D, small, below the rate) travel
uncompressed, fused into one buffer. The matrices' factors travel fused too: one tensor P of
every matrix's n x r factor, one tensor Q^T of every r x m factor. A server sums what the
workers push, exactly: no server-side codec or error feedback.

PowerSGD, two rounds per step: P_i = X_i Q with X_i = M_i + E_i, Q warm-started from the
last step (seeded at the first); P = orth(sum P_i); Q_i = X_i^T P; E_i = X_i - P Q_i^T (the
worker's own reconstruction; PyTorch's hook subtracts P mean(Q)^T, which has the same sum
over workers); Q = sum Q_i; the average is P Q^T / workers.

ACP-SGD, one round per step, alternating: P steps (the 1st, 3rd, ... compressed step):
Q = orth(Q kept), P_i = X_i Q, E_i = X_i - P_i Q^T, P = sum P_i; Q steps: P = orth(P kept),
Q_i = X_i^T P, E_i = X_i - P Q_i^T, Q = sum Q_i. The average is P Q^T / workers from the
factor just summed and the one kept, identical on every worker.

The first factor Q is drawn from a generator seeded by (seed, the tensor's name): every
worker starts from the same one. Before ``start_step`` every tensor is averaged uncompressed.
On CPU the products and the error update run in Numba kernels that pass over M and E once
per product (``kernels/cpu/lowrank.py``); on other devices the same steps run as torch ops.
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from ..compressors.lowrank import LowRankParams
from ..kernels.cpu import lowrank as kernels
from . import ops


@dataclass
class _Matrix:
    name: str
    tensor_id: int
    rows: int
    cols: int
    rank: int
    p_at: int       # offset of its n x r factor in the flat P
    q_at: int       # offset of its r x m factor in the flat Q^T
    error: torch.Tensor | None = None


class LowRankReducer:
    """Averages ``tensors`` over every worker with PowerSGD or ACP-SGD, one ``reduce`` per step.

    Args:
        entries: ``(name, tensor)`` pairs: every worker passes the same names, shapes and order.
            The tensors' shapes and dtypes are what each ``reduce`` must get.
        params: the checked ``compression_params`` (``LowRankParams``).
        prefix: names the fused tensors (``prefix + "LowRank.P"`` ...): unique per reducer.
        min_bytes: matrices smaller than this travel uncompressed (BYTEPS_MIN_COMPRESS_BYTES).
        priority: of the push_pulls.
    Raises:
        ValueError: a tensor that is not float32 (naming it).
    """

    def __init__(self, entries: list[tuple[str, torch.Tensor]], params: LowRankParams, prefix: str,
                 min_bytes: int = 0, priority: int = 0):
        self.params = params
        self.prefix = prefix
        self.priority = priority
        self.step = 0  # steps reduced so far (compressed or not)
        self.matrices: list[_Matrix] = []
        self.raw: list[tuple[str, int, int]] = []  # (name, tensor id, numel), fused uncompressed
        device = None
        p_len = q_len = 0
        for name, t in entries:
            if t.dtype != torch.float32:
                raise ValueError(f"compressor {params.method!r}: {name!r} is {str(t.dtype).replace('torch.', '')}; "
                                 f"low-rank compression takes float32 tensors (exempt it with a rule "
                                 f"{{'compressor': 'none'}})")
            device = device or t.device
            rows, cols = (t.shape[0], t.numel() // t.shape[0]) if t.dim() >= 2 else (1, t.numel())
            if t.dim() >= 2 and params.compresses(rows, cols) and 4 * t.numel() >= min_bytes:
                r = params.rank_for(rows, cols)
                self.matrices.append(_Matrix(name, id(t), rows, cols, r, p_len, q_len))
                p_len, q_len = p_len + rows * r, q_len + r * cols
            else:
                self.raw.append((name, id(t), t.numel()))
        self.device = device or torch.device("cpu")
        self.p = torch.zeros(p_len, dtype=torch.float32, device=self.device)
        self.q = torch.zeros(q_len, dtype=torch.float32, device=self.device)
        self.raw_buffer = torch.zeros(sum(n for _, _, n in self.raw), dtype=torch.float32, device=self.device)
        self.factors_ready = False  # Q (and, for ACP-SGD after a P step, P) hold a step's factors
        # the last compressed step's seconds of factor work (rounds left out) and of
        # reconstruction: what the planner re-bases its low-rank costs on
        self.work_s = self.rebuild_s = 0.0
        self._in_sums = 0.0
        self.math = NumbaMath if self.device.type == "cpu" else TorchMath

    # ---- one step ----------------------------------------------------------------------

    @property
    def compressing(self) -> bool:
        return self.step >= self.params.start_step

    def reduce(self, tensors: dict[int, torch.Tensor]) -> None:
        """Average every tensor (by ``id`` of the entry it stands for) over the workers, in place."""
        missing = [n for n, i, _ in self.raw if i not in tensors] + \
                  [m.name for m in self.matrices if m.tensor_id not in tensors]
        if missing:
            raise ValueError(f"{self.prefix}LowRank: no tensor for {missing[:5]}")
        tracer = ops.client().tracer
        handles = [self._start_raw(tensors)]
        if not self.compressing:
            handles += [(ops.push_pull_async_inplace(tensors[m.tensor_id], average=True, priority=self.priority,
                                                     name=f"{self.prefix}LowRank.full.{m.name}"), None)
                        for m in self.matrices]
        elif self.matrices:
            with tracer.span(f"{self.params.method} factors", step=self.step):
                views = {m.tensor_id: _matrix_view(tensors[m.tensor_id], m) for m in self.matrices}
                self._compressed_step(views, tracer)
                for m in self.matrices:
                    out = views[m.tensor_id]
                    if out.data_ptr() != tensors[m.tensor_id].data_ptr():
                        tensors[m.tensor_id].copy_(out.view_as(tensors[m.tensor_id]))
        for handle, finish in handles:
            if handle is None:
                continue
            ops.synchronize(handle)
            if finish is not None:
                finish()
        self.step += 1

    def _start_raw(self, tensors: dict[int, torch.Tensor]):
        if not self.raw:
            return None, None
        offset = 0
        with torch.no_grad():
            for _, i, n in self.raw:
                self.raw_buffer[offset:offset + n].copy_(tensors[i].reshape(-1))
                offset += n
        handle = ops.push_pull_async_inplace(self.raw_buffer, average=True, priority=self.priority,
                                             name=f"{self.prefix}LowRank.raw")

        def finish() -> None:
            at = 0
            with torch.no_grad():
                for _, i, n in self.raw:
                    tensors[i].copy_(self.raw_buffer[at:at + n].view_as(tensors[i]))
                    at += n
        return handle, finish

    def _compressed_step(self, grads: dict[int, torch.Tensor], tracer) -> None:
        math, workers = self.math, ops.size()
        start, self._in_sums = time.perf_counter(), 0.0
        if not self.factors_ready:
            self._seed_q()
        k = self.step - self.params.start_step
        for m in self.matrices:
            if m.error is None:
                m.error = torch.zeros(m.rows, m.cols, dtype=torch.float32, device=self.device)
        if self.params.method == "powersgd":
            for m in self.matrices:  # round 1: P_i = X_i Q, and E_i holds X_i until round 2
                math.factor_rows(grads[m.tensor_id], m.error, self._qt(m), self._p(m), True, False)
            self._sum(self.p, "P", tracer)
            math.orthonormalize(self.p, self._layout(by_rows=False), False)
            for m in self.matrices:  # round 2: Q_i = X_i^T P, E_i = X_i - P Q_i^T
                math.factor_cols(None, m.error, self._p(m), self._qt(m), False)
                math.subtract_product(None, m.error, self._p(m), self._qt(m), False)
            self._sum(self.q, "Q", tracer)
        elif k % 2 == 0:  # ACP-SGD, P step
            math.orthonormalize(self.q, self._layout(by_rows=True), True)
            for m in self.matrices:
                math.factor_rows(grads[m.tensor_id], m.error, self._qt(m), self._p(m), True, True)
            self._sum(self.p, "P", tracer)
        else:  # ACP-SGD, Q step
            math.orthonormalize(self.p, self._layout(by_rows=False), False)
            for m in self.matrices:
                math.factor_cols(grads[m.tensor_id], m.error, self._p(m), self._qt(m), True)
                math.subtract_product(grads[m.tensor_id], m.error, self._p(m), self._qt(m), True)
            self._sum(self.q, "Q", tracer)
        rebuild = time.perf_counter()
        with tracer.span(f"{self.params.method} reconstruct", step=self.step):
            for m in self.matrices:
                math.reconstruct(self._p(m), self._qt(m), 1.0 / workers, grads[m.tensor_id])
        self.work_s = rebuild - start - self._in_sums
        self.rebuild_s = time.perf_counter() - rebuild

    def _sum(self, flat: torch.Tensor, which: str, tracer) -> None:
        """Every worker's factor summed, exactly, in place (uncompressed float32 push_pull)."""
        start = time.perf_counter()
        with tracer.span(f"{self.params.method} round {which}", step=self.step):
            ops.push_pull_inplace(flat, average=False, priority=self.priority, name=f"{self.prefix}LowRank.{which}")
        self._in_sums += time.perf_counter() - start

    def _seed_q(self) -> None:
        """Q's first value: N(0, 1) from a generator seeded by (seed, name), then orthonormalised."""
        for m in self.matrices:
            g = torch.Generator().manual_seed(self.params.seed * 1_000_003 + zlib.crc32(m.name.encode()))
            self._qt(m).copy_(torch.randn(m.rank, m.cols, generator=g))
        self.math.orthonormalize(self.q, self._layout(by_rows=True), True)
        self.factors_ready = True

    def _p(self, m: _Matrix) -> torch.Tensor:
        return self.p[m.p_at:m.p_at + m.rows * m.rank].view(m.rows, m.rank)

    def _qt(self, m: _Matrix) -> torch.Tensor:
        return self.q[m.q_at:m.q_at + m.rank * m.cols].view(m.rank, m.cols)

    def _layout(self, by_rows: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(offsets, vector lengths, ranks) of the matrices in the flat Q^T (``by_rows``) or P."""
        offsets = np.array([m.q_at if by_rows else m.p_at for m in self.matrices], np.int64)
        lengths = np.array([m.cols if by_rows else m.rows for m in self.matrices], np.int64)
        ranks = np.array([m.rank for m in self.matrices], np.int64)
        return offsets, lengths, ranks

    # ---- what a checkpoint holds -----------------------------------------------------------

    def factors(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Each compressed matrix's (P, Q^T) as kept now (copies)."""
        return {m.name: (self._p(m).clone(), self._qt(m).clone()) for m in self.matrices}

    def errors(self) -> dict[int, torch.Tensor]:
        """This worker's error buffers, flat copies by the id of the tensor each stands for."""
        return {m.tensor_id: m.error.reshape(-1).clone() for m in self.matrices if m.error is not None}

    def state_dict(self) -> dict:
        """Step count, the kept factors and this worker's error buffers (by tensor name)."""
        return {"method": self.params.method, "step": self.step, "factors_ready": self.factors_ready,
                "p": self.p.clone(), "q": self.q.clone(),
                "errors": {m.name: m.error.clone() for m in self.matrices if m.error is not None}}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``: the next ``reduce`` continues exactly where it left off."""
        if state.get("method") != self.params.method:
            raise ValueError(f"low-rank state of {state.get('method')!r}, this reducer runs {self.params.method!r}")
        if state["p"].shape != self.p.shape or state["q"].shape != self.q.shape:
            raise ValueError(f"low-rank state: factors of {tuple(state['p'].shape)} / {tuple(state['q'].shape)} "
                             f"elements, these matrices need {tuple(self.p.shape)} / {tuple(self.q.shape)}")
        self.step, self.factors_ready = int(state["step"]), bool(state["factors_ready"])
        self.p.copy_(state["p"])
        self.q.copy_(state["q"])
        for m in self.matrices:
            error = state["errors"].get(m.name)
            m.error = None if error is None else error.to(self.device, torch.float32).clone().view(m.rows, m.cols)


def _matrix_view(t: torch.Tensor, m: _Matrix) -> torch.Tensor:
    """``t`` as a contiguous rows x cols matrix (its own memory when it is contiguous)."""
    return t.detach().reshape(m.rows, m.cols).contiguous()


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
