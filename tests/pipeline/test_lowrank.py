"""Low-rank compression without a job: parameters, which tensors are factored, Gram-Schmidt on
zero and rank-deficient matrices, and the torch steps (a GPU worker's) against the Numba ones.
The methods against a numpy replay in real jobs: test_lowrank_integ.py."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from gradpress.compressors.lowrank import LowRankParams
from gradpress.compressors.spec import CodecSpec
from gradpress.kernels.cpu import lowrank as kernels
from fake_comm import FakeComm
from gradpress.pipeline.lowrank import LowRankReducer
from gradpress.pipeline import lowrank_math
from gradpress.pipeline.lowrank_math import NumbaMath, TorchMath


@pytest.mark.parametrize("params,message", [
    ({"compressor": "powersgd", "rank": 0}, "['rank'] = 0"),
    ({"compressor": "acpsgd", "rank": -2}, "['rank'] = -2"),
    ({"compressor": "acpsgd", "rank": 1.5}, "an integer"),
    ({"compressor": "powersgd", "rank": "four"}, "'rank'"),
    ({"compressor": "powersgd", "start_step": -1}, "'start_step'"),
    ({"compressor": "acpsgd", "min_compression_rate": -1}, "'min_compression_rate'"),
    ({"compressor": "powersgd", "ef": "vanilla"}, "unknown compression_params ['ef']"),
])
def test_bad_parameters_are_named(params, message):
    with pytest.raises(ValueError, match="compression_params") as e:
        CodecSpec.from_params(params)
    assert message in str(e.value)


def test_defaults_and_the_spec():
    spec = CodecSpec.from_params({"compressor": "acpsgd"})
    assert spec.is_lowrank and not spec.is_auto
    assert LowRankParams.parse(spec.compression_params) == LowRankParams("acpsgd", 4, 0, 2.0, 0)
    with pytest.raises(ValueError, match="factors whole gradient matrices"):
        spec.build("worker")


def test_which_tensors_are_factored():
    p = LowRankParams("powersgd", 4, 0, 2.0, 0)
    assert p.rank_for(3, 1000) == 3 and p.rank_for(100, 100) == 4
    assert p.compresses(64, 64)          # 4096 >= 2 * 4 * 128
    assert not p.compresses(8, 8)        # 64 < 2 * 4 * 16
    assert not p.compresses(3, 1000)     # rank 3: 3000 < 2 * 3 * 1003
    entries = [("w", torch.zeros(64, 64)), ("b", torch.zeros(64)), ("tiny", torch.zeros(8, 8)),
               ("conv", torch.zeros(32, 16, 3, 3)), ("small", torch.zeros(40, 40))]
    r = LowRankReducer(entries, p, "t.", min_bytes=4 * 40 * 40 + 4)
    assert [m.name for m in r.matrices] == ["w", "conv"]
    assert [n for n, _, _ in r.raw] == ["b", "tiny", "small"]   # small: below min_bytes
    conv = r.matrices[1]
    assert (conv.rows, conv.cols, conv.rank) == (32, 144, 4)
    assert r.p.numel() == 64 * 4 + 32 * 4 and r.q.numel() == 4 * 64 + 4 * 144


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_tensors_other_than_float32_and_half_are_refused_by_name(dtype):
    with pytest.raises(ValueError, match=r"'layer.weight' is (float64|int64).*float32, float16 and bfloat16"):
        LowRankReducer([("layer.weight", torch.zeros(16, 16, dtype=dtype))], LowRankParams("acpsgd", 1, 0, 2.0, 0),
                       "t.")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_tensors_are_factored_widened_and_narrowed_back(dtype):
    """The route widens them to float32 for the reducer: the same average, rounded once, as
    the float32 tensors give (one worker, before start_step: the identity)."""
    from gradpress.pipeline.routes.lowrank import LowRankRoute
    w = torch.nn.Parameter(torch.zeros(16, 16, dtype=dtype))
    reducer = LowRankReducer([("w", w)], LowRankParams("acpsgd", 1, 0, 2.0, 0), "t.", comm=FakeComm(size=1))
    route = LowRankRoute([w], reducer)
    w32 = torch.nn.Parameter(torch.zeros(16, 16))
    reference = LowRankReducer([("w", w32)], LowRankParams("acpsgd", 1, 0, 2.0, 0), "t.", comm=FakeComm(size=1))
    for step in range(3):
        g = torch.randn(16, 16, generator=torch.Generator().manual_seed(step)).to(dtype)
        want = g.float()
        reference.reduce({id(w32): want})
        route.submit(w, g)
        out = route.finish()[id(w)]
        assert out is g and out.dtype == dtype
        assert torch.equal(out, want.to(dtype)), f"step {step}: differs from the float32 reduction rounded once"
    assert reducer.matrices[0].error.dtype == torch.float32


@pytest.mark.parametrize("math", [NumbaMath, TorchMath])
@pytest.mark.parametrize("by_rows", [True, False])
def test_orthonormalize_zero_rank_deficient_and_full(math, by_rows):
    g = torch.Generator().manual_seed(0)
    full = torch.randn(3, 50, generator=g)
    deficient = torch.stack([full[0], 2 * full[0], full[1]])   # the second vector is the first, doubled
    zero = torch.zeros(2, 30)
    mats = [full, deficient, zero]
    layout_vectors = [m if by_rows else m.t().contiguous() for m in mats]
    flat = torch.cat([v.reshape(-1) for v in layout_vectors])
    offsets = np.cumsum([0] + [m.numel() for m in mats[:-1]]).astype(np.int64)
    layout = (offsets, np.array([m.shape[1] for m in mats], np.int64), np.array([m.shape[0] for m in mats], np.int64))
    math.orthonormalize(flat, layout, by_rows)
    assert torch.isfinite(flat).all()
    out = []
    for m, off in zip(mats, offsets):
        block = flat[off:off + m.numel()]
        out.append(block.view(m.shape) if by_rows else block.view(m.shape[1], m.shape[0]).t())
    gram = out[0] @ out[0].t()
    assert torch.allclose(gram, torch.eye(3), atol=1e-5), gram
    assert abs(float(out[1][0].norm()) - 1) < 1e-5 and torch.equal(out[1][1], torch.zeros(50))  # dependent
    assert torch.equal(out[2], torch.zeros(2, 30))


@pytest.mark.parametrize("one_batch", [True, False])
@pytest.mark.parametrize("by_rows", [True, False])
def test_torch_orthonormalizes_every_matrix_at_once_as_the_kernel_does_one_by_one(by_rows, one_batch, monkeypatch):
    """The torch path (a GPU worker's) runs Gram-Schmidt on zero-padded batches of matrices
    (on a GPU every matrix in one, here by powers of two of the lengths unless told):
    matrices of different ranks and lengths in one batch, a buffer with room after the
    matrices, and a NaN that stays in its own matrix, against the kernel matrix by matrix."""
    monkeypatch.setitem(lowrank_math.PAD_BUDGET, "cpu", lowrank_math.GPU_BUDGET if one_batch else 0)
    monkeypatch.setattr(lowrank_math, "_plans", {})
    shapes = [(4, 300), (2, 260), (4, 511), (1, 257), (3, 40), (4, 33), (2, 2000)]   # (rank, length)
    g = torch.Generator().manual_seed(3)
    offsets = np.cumsum([0] + [r * n for r, n in shapes[:-1]]).astype(np.int64)
    layout = (offsets, np.array([n for _, n in shapes], np.int64), np.array([r for r, _ in shapes], np.int64))
    used = sum(r * n for r, n in shapes)
    x = torch.randn(used + 17, generator=g)
    x[offsets[4] + 5] = float("nan")
    want, got = x.clone(), x.clone()
    NumbaMath.orthonormalize(want, layout, by_rows)
    TorchMath.orthonormalize(got, layout, by_rows)
    assert torch.equal(got[used:], x[used:]), "past the matrices: untouched"
    nan = slice(int(offsets[4]), int(offsets[5]))
    assert got[nan].isnan().any() and want[nan].isnan().any()
    ok = torch.ones(len(x), dtype=torch.bool)
    ok[nan] = False
    assert torch.isfinite(got[ok]).all(), "a NaN left its matrix"
    assert torch.allclose(got[ok], want[ok], rtol=1e-5, atol=1e-6)
    TorchMath.orthonormalize(got, layout, by_rows)   # again, with the plan it made: orthonormal stays so
    assert torch.allclose(got[ok], want[ok], rtol=1e-4, atol=1e-5)
    assert [len(batch[0][0]) for batch in lowrank_math._plans.popitem()[1]] == ([7] if one_batch else [2, 4, 1])


def test_kernels_and_torch_ops_agree():
    g = torch.Generator().manual_seed(1)
    m, e0 = torch.randn(37, 23, generator=g), torch.randn(37, 23, generator=g)
    qt0, p0 = torch.randn(3, 23, generator=g), torch.randn(37, 3, generator=g)
    res = []
    for math in (NumbaMath, TorchMath):
        e, p, qt, out = e0.clone(), p0.clone(), qt0.clone(), torch.empty(37, 23)
        math.factor_rows([m], [e], [qt], [p], True, True)
        math.factor_cols_subtract([m], [e], [p], [qt], True)
        math.factor_cols_subtract(None, [e], [p], [qt], False)
        math.reconstruct([p], [qt], 0.5, [out])
        res.append((e, p, qt, out))
    for a, b in zip(*res):  # (the factors are not orthonormal here: values reach 1e5)
        assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max())
    x = m + e0   # and the definition: P = X Q, E = X - P Q^T
    p = torch.empty(37, 3)
    e = e0.clone()
    kernels.factor_rows(m.numpy(), e.numpy(), qt0.numpy(), p.numpy(), True, True)
    assert torch.allclose(p, x @ qt0.t(), atol=1e-4) and torch.allclose(e, x - p @ qt0, atol=1e-4)


@pytest.mark.parametrize("method", ["powersgd", "acpsgd"])
def test_one_worker_steps_agree_between_numba_and_torch(method):
    """A whole reducer, one worker (a push_pull is the identity), a few steps: the torch path (what
    a GPU worker runs) and the Numba path give the same gradients; with one worker and a rank as
    large as the matrix, the error feedback loses nothing: sum of outputs = sum of inputs - E."""
    shapes = {"w": (12, 10), "conv": (6, 2, 2, 2), "b": (5,)}
    outs = []
    for math in (NumbaMath, TorchMath):
        tensors = {n: torch.zeros(s) for n, s in shapes.items()}
        r = LowRankReducer(list(tensors.items()), LowRankParams(method, 2, 1, 0.5, 3), "t.", comm=FakeComm(size=1))
        r.math = math
        g = torch.Generator().manual_seed(5)
        steps = []
        for _ in range(5):
            grads = {id(t): torch.randn(t.shape, generator=g) for t in tensors.values()}
            r.reduce(grads)
            steps.append([grads[id(t)].clone() for t in tensors.values()])
        outs.append((steps, r))
    for a, b in zip(outs[0][0], outs[1][0]):
        for x, y in zip(a, b):
            assert torch.allclose(x, y, rtol=1e-4, atol=1e-5)
    assert outs[0][1].step == 5 and all(m.error is not None for m in outs[0][1].matrices)


def test_reachable_from_the_job_file_and_rules(tmp_path):
    from gradpress.compressors.policy import CompressionPolicy
    job = tmp_path / "job.toml"
    job.write_text('[compression.default]\ncompressor = "acpsgd"\nrank = 2\n\n'
                   '[[compression.rules]]\npattern = "embed*"\ncompressor = "none"\n')
    policy = CompressionPolicy.from_job_file(str(job), 0).overridden_by(
        None, [("head.*", {"compressor": "powersgd", "rank": 1, "start_step": 10})])
    assert LowRankParams.parse(policy.rule_for("layer.weight").compression_params) == \
        LowRankParams("acpsgd", 2, 0, 2.0, 0)
    assert policy.rule_for("embed.weight") is None
    assert LowRankParams.parse(policy.rule_for("head.weight").compression_params).start_step == 10
    job.write_text('[compression.default]\ncompressor = "powersgd"\nrank = 0\n')
    with pytest.raises(ValueError, match=r"compression default: compression_params\['rank'\] = 0"):
        CompressionPolicy.from_job_file(str(job), 0)


class _Clock:
    """Stands in for the device's clock: each timing event records the time it is set to."""
    now = 0.0


class _TimingEvent:
    """torch.cuda.Event(enable_timing=True) on a host: records ``_Clock.now`` (ms)."""
    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.at, self.waited = None, False

    def record(self, stream=None) -> None:
        self.at = _Clock.now

    def synchronize(self) -> None:
        self.waited = True

    def elapsed_time(self, end: "_TimingEvent") -> float:
        assert self.at is not None and end.at is not None
        return end.at - self.at


@pytest.mark.parametrize("method, sums", [("powersgd", 2), ("acpsgd", 1)])
def test_a_gpu_reducers_factor_work_is_timed_on_the_device_for_the_planner(monkeypatch, method, sums):
    """On a GPU the factor ops run after the step's thread launched them, and their time
    shows in the sums' waits, which the host's figures leave out. Once the planner asks
    (``timings``), the next compressed step records timing events around the same stretches; the
    re-basing takes the device's seconds where they are longer, the sums' rounds left out."""
    from gradpress.pipeline.planning.profiling import device_seconds, factor_seconds
    tensors = {"w": torch.zeros(12, 10), "b": torch.zeros(5)}
    r = LowRankReducer(list(tensors.items()), LowRankParams(method, 2, 0, 0.5, 3), "t.", comm=FakeComm(size=1))
    grads = lambda: {id(t): torch.randn(t.shape) for t in tensors.values()}  # noqa: E731
    assert r.timings()[2] == []   # a host's reducer records none
    r.reduce(grads())
    assert r.timings()[2] == []
    r.device = torch.device("cuda")   # (its ops stay on the host: only the events are the GPU's)
    monkeypatch.setattr(torch.cuda, "Event", _TimingEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    r.reduce(grads())
    assert r.timings()[2] == []   # not asked before this step: none recorded
    wait, math = r.comm.wait, r.math

    class Timed:   # the factor products take 1.5 ms of the device each, the reconstruction 7, a sum 50
        @staticmethod
        def factor_rows(*a):
            math.factor_rows(*a)
            _advance(1.5)

        @staticmethod
        def factor_cols_subtract(*a):
            math.factor_cols_subtract(*a)
            _advance(1.5)

        @staticmethod
        def reconstruct(*a):
            math.reconstruct(*a)
            _advance(7.0)
        orthonormalize = math.orthonormalize
    r.math = Timed
    monkeypatch.setattr(r.comm, "wait", lambda *a, **k: (_advance(50.0), wait(*a, **k))[1])
    r.reduce(grads())
    host_work, host_rebuild, marks = r.timings()
    assert len(marks) == 3 + 2 * sums
    work, rebuild = device_seconds(marks)
    assert marks[-1].waited
    assert work == pytest.approx(sums * 1.5e-3) and rebuild == pytest.approx(7e-3)   # one product a sum
    assert factor_seconds(host_work, host_rebuild, marks) == (max(host_work, work), max(host_rebuild, rebuild))
    assert factor_seconds(0.5, 0.25, []) == (0.5, 0.25)   # a host's: its own seconds
    r.reduce(grads())   # the step after each call
    r.reduce(grads())
    assert r.timings()[2] == []   # the planner stopped asking: none
    r.reduce(grads())
    assert len(r.timings()[2]) == 3 + 2 * sums


def _advance(ms: float) -> None:
    _Clock.now += ms


@pytest.mark.parametrize("method", ["powersgd", "acpsgd"])
@pytest.mark.parametrize("math", ["NumbaMath", "TorchMath"])
def test_a_step_with_an_inf_gradient_is_skipped_and_the_next_ones_are_finite(method, math):
    """A loss scaler's overflow: the summed factor is not finite, the same on every worker, so
    every worker skips the step alike (NaN averages, for a GradScaler to skip), keeps its
    factors and starts its error feedback again; one inf used to make every later step NaN."""
    w = torch.zeros(16, 16)
    r = LowRankReducer([("w", w)], LowRankParams(method, 2, 0, 0.5, 0), "t.", comm=FakeComm(size=1))
    r.math = getattr(lowrank_math, math)
    g = torch.Generator().manual_seed(0)
    for step in range(5):
        grad = torch.randn(16, 16, generator=g)
        if step == 1:
            grad[3, 4] = float("inf")
        q_before, step_before = r.q.clone(), r.step
        r.reduce({id(w): grad})
        if step == 1:
            assert torch.isnan(grad).all() and torch.equal(r.q, q_before) and r.step == step_before
            assert not r.matrices[0].error.any()
        else:
            assert torch.isfinite(grad).all() and torch.isfinite(r.q).all(), step
            assert torch.isfinite(r.matrices[0].error).all() and r.step == step_before + 1, step
