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
per product (``kernels/cpu/lowrank.py``); on other devices the same steps run as torch ops
(``lowrank_math``).
"""
from __future__ import annotations

import logging
import time
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from ..compressors.lowrank import LowRankParams
from ..torch.dtypes import HALVES, dtype_name
from ..torch.handles import wait_all
from .comm import OPS, Comm
from .lowrank_math import NumbaMath, TorchMath
from .routes.bucket import Bucket

log = logging.getLogger(__name__)


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
        comm: the job's push_pulls (a fake in tests).
    Raises:
        ValueError: a tensor that is not float32, float16 or bfloat16 (naming it; the route
            hands half-precision tensors over widened to float32).
    """

    def __init__(self, entries: list[tuple[str, torch.Tensor]], params: LowRankParams, prefix: str,
                 min_bytes: int = 0, priority: int = 0, comm: Comm = OPS):
        self.params, self.comm, self.prefix, self.priority = params, comm, prefix, priority
        self.step = 0  # steps reduced so far (compressed or not)
        self.matrices: list[_Matrix] = []
        self.raw: list[tuple[str, int, int]] = []  # (name, tensor id, numel), fused uncompressed
        raw_members = []
        device = None
        p_len = q_len = 0
        for name, t in entries:
            if t.dtype not in (torch.float32, *HALVES):
                raise ValueError(f"compressor {params.method!r}: {name!r} is {dtype_name(t.dtype)}; "
                                 f"low-rank compression takes float32, float16 and bfloat16 tensors (exempt it "
                                 f"with a rule {{'compressor': 'none'}})")
            device = device or t.device
            if t.device != device:  # one set of flat factors and products: one device's tensors
                raise ValueError(f"compressor {params.method!r}: {name!r} is on {t.device}, the tensors before it on "
                                 f"{device}; low-rank compression takes one device's tensors (one GPU per "
                                 f"worker process, as BytePS runs; or exempt the others with a rule)")
            rows, cols = (t.shape[0], t.numel() // t.shape[0]) if t.dim() >= 2 else (1, t.numel())
            if t.dim() >= 2 and params.compresses(rows, cols) and 4 * t.numel() >= min_bytes:
                r = params.rank_for(rows, cols)
                self.matrices.append(_Matrix(name, id(t), rows, cols, r, p_len, q_len))
                p_len, q_len = p_len + rows * r, q_len + r * cols
            else:
                self.raw.append((name, id(t), t.numel()))
                raw_members.append(t)
        self.device = device or torch.device("cpu")
        self.p = torch.zeros(p_len, dtype=torch.float32, device=self.device)
        self.q = torch.zeros(q_len, dtype=torch.float32, device=self.device)
        self.raw_bucket = Bucket(f"{prefix}LowRank.raw", raw_members, None, priority, comm) if raw_members else None
        self.factors_ready = False  # Q (and, for ACP-SGD after a P step, P) hold a step's factors
        # the last compressed step's seconds of factor work (rounds left out) and of
        # reconstruction: what the planner re-bases its low-rank costs on
        self.work_s = self.rebuild_s = 0.0
        self._in_sums = 0.0
        # on a GPU, in the step after the planner asked (``timings``): timing events, which time
        # the same stretches on the device, where the ops run after the step's thread
        self._marks: list | None = None
        self._timed = False
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
        comm = self.comm
        if self.raw_bucket is not None:
            for t in self.raw_bucket.members:
                self.raw_bucket.submit(t, tensors[id(t)])
        handles, skipped = [], False
        if not self.compressing:
            handles = [comm.start(tensors[m.tensor_id], f"{self.prefix}LowRank.full.{m.name}", priority=self.priority)
                       for m in self.matrices]
        elif self.matrices:
            with comm.span(f"{self.params.method} factors", step=self.step):
                views = {m.tensor_id: _matrix_view(tensors[m.tensor_id], m) for m in self.matrices}
                skipped = not self._compressed_step(views)
                for m in self.matrices:
                    out = views[m.tensor_id]
                    if out.data_ptr() != tensors[m.tensor_id].data_ptr():
                        tensors[m.tensor_id].copy_(out.view_as(tensors[m.tensor_id]))
        wait_all(handles, comm.wait)
        if self.raw_bucket is not None:
            self.raw_bucket.finish()
        self.step += 0 if skipped else 1  # (a skipped step is taken again)

    def key_names(self) -> list[str]:
        """The names of every tensor this reducer pushes (what releasing it frees)."""
        names = [f"{self.prefix}LowRank.{which}" for which in ("P", "Q")]
        names += [f"{self.prefix}LowRank.full.{m.name}" for m in self.matrices]
        return names + ([self.raw_bucket.name] if self.raw_bucket is not None else [])

    def _compressed_step(self, grads: dict[int, torch.Tensor]) -> bool:
        """One compressed step into ``grads``; False where it was skipped (``_skip``)."""
        math, workers = self.math, self.comm.size()
        start, self._in_sums = time.perf_counter(), 0.0
        self._marks, self._timed = ([] if self._timed else None), False
        self._mark()
        if not self.factors_ready:
            self._seed_q()
        k = self.step - self.params.start_step
        for m in self.matrices:
            if m.error is None:
                m.error = torch.zeros(m.rows, m.cols, dtype=torch.float32, device=self.device)
        ms = [grads[m.tensor_id] for m in self.matrices]
        es = [m.error for m in self.matrices]
        ps, qts = [self._p(m) for m in self.matrices], [self._qt(m) for m in self.matrices]
        kept = (self.p.clone(), self.q.clone())  # the factors as they were: a skipped step keeps them
        if self.params.method == "powersgd":
            math.factor_rows(ms, es, qts, ps, True, False)  # round 1: P_i = X_i Q, and E_i holds X_i until round 2
            if not self._sum(self.p, "P"):
                return self._skip(ms, kept)
            math.orthonormalize(self.p, self._layout(by_rows=False), False)
            math.factor_cols_subtract(None, es, ps, qts, False)  # round 2: Q_i = X_i^T P, E_i = X_i - P Q_i^T
            if not self._sum(self.q, "Q"):
                return self._skip(ms, kept)
        elif k % 2 == 0:  # ACP-SGD, P step
            math.orthonormalize(self.q, self._layout(by_rows=True), True)
            math.factor_rows(ms, es, qts, ps, True, True)
            if not self._sum(self.p, "P"):
                return self._skip(ms, kept)
        else:  # ACP-SGD, Q step
            math.orthonormalize(self.p, self._layout(by_rows=False), False)
            math.factor_cols_subtract(ms, es, ps, qts, True)
            if not self._sum(self.q, "Q"):
                return self._skip(ms, kept)
        rebuild = time.perf_counter()
        self._mark()
        with self.comm.span(f"{self.params.method} reconstruct", step=self.step):
            math.reconstruct(ps, qts, 1.0 / workers, ms)
        self._mark()
        self.work_s = rebuild - start - self._in_sums
        self.rebuild_s = time.perf_counter() - rebuild
        return True

    def _skip(self, ms: list[torch.Tensor], kept: tuple[torch.Tensor, torch.Tensor]) -> bool:
        """A step whose summed factor is not finite (an overflow on some worker), skipped alike
        on every worker (the same sum): NaN averages (a GradScaler skips it too), the factors
        kept, the error buffers, which took the overflow in, zeroed (else every step is NaN)."""
        self.p.copy_(kept[0])
        self.q.copy_(kept[1])
        self._marks = None  # its device timings stop short: the planner keeps the last step's
        for m, out in zip(self.matrices, ms):
            m.error.zero_()
            out.fill_(float("nan"))
        log.warning("%sLowRank: step %d's summed factors are not finite (an inf or NaN gradient): skipped on "
                    "every worker, its error feedback started again", self.prefix, self.step)
        return False

    def timings(self) -> tuple[float, float, list]:
        """The last compressed step's factor work and reconstruction, seconds of the step's
        thread, and on a GPU the events that time them on the device (``device_seconds``),
        which the next compressed step records (none where it was not asked for)."""
        marks, self._marks, self._timed = self._marks or [], None, self.device.type == "cuda"
        return self.work_s, self.rebuild_s, marks

    def _mark(self) -> None:
        if self._marks is not None:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            self._marks.append(event)

    def _sum(self, flat: torch.Tensor, which: str) -> bool:
        """Every worker's factor summed, exactly, in place (uncompressed float32 push_pull);
        whether the sum is finite (the same answer on every worker)."""
        start = time.perf_counter()
        self._mark()
        with self.comm.span(f"{self.params.method} round {which}", step=self.step):
            self.comm.wait(self.comm.start(flat, f"{self.prefix}LowRank.{which}", priority=self.priority,
                                           average=False))
        self._mark()
        self._in_sums += time.perf_counter() - start
        return flat.is_meta or bool(torch.isfinite(flat).all())  # (a meta tensor has no values)

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
        # checked whole before anything changes: a refused state leaves the reducer as it was
        sizes = {m.name: m.rows * m.cols for m in self.matrices}
        unknown = sorted(set(state["errors"]) - set(sizes))
        wrong = [n for n, e in state["errors"].items() if n in sizes and e.numel() != sizes[n]]
        if unknown or wrong:
            raise ValueError(f"low-rank state: error buffers of matrices not compressed here {unknown[:5]}"
                             if unknown else f"low-rank state: error buffers of other sizes for {wrong[:5]}")
        self.step, self.factors_ready = int(state["step"]), bool(state["factors_ready"])
        self.p.copy_(state["p"])
        self.q.copy_(state["q"])
        for m in self.matrices:
            error = state["errors"].get(m.name)
            m.error = None if error is None else error.to(self.device, torch.float32).clone().view(m.rows, m.cols)


def _matrix_view(t: torch.Tensor, m: _Matrix) -> torch.Tensor:
    """``t`` as a contiguous rows x cols matrix (its own memory when it is contiguous)."""
    return t.detach().reshape(m.rows, m.cols).contiguous()
