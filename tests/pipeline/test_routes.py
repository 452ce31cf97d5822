"""Each route of the gradient pipeline alone (gradpress/pipeline/routes), against a fake job
(fake_comm.FakeComm: one worker of two, the other's pushes drawn from a seeded generator).
The averages a route hands back equal a numpy replay of the same sums; with tensors on
``meta`` (a device that is not the host's) every buffer a route makes and everything it
sends stays on that device. Real jobs run the same routes in the *_integ tests."""
import time

import numpy as np
import pytest
import torch

from fake_comm import FakeComm
from gradpress.compressors.lowrank import LowRankParams
from gradpress.compressors.spec import CodecSpec
from gradpress.pipeline.lowrank import LowRankReducer
from gradpress.pipeline.routes.bucket import Bucket
from gradpress.pipeline.routes.direct import DirectRoute
from gradpress.pipeline.routes.lowrank import LowRankRoute
from gradpress.pipeline.routes.planned import PlannedRoute
from gradpress.pipeline.routes.rows import DensityVote, RowsRoute, nonzero_fraction
from gradpress.planner.decide import Plan
from gradpress.planner.synthetic import synthetic_profile
from gradpress.torch.compression import Compression, check_compression
from gradpress.worker.sparse import extract

ONEBIT = {"compressor": "onebit", "scaling": True, "ef": "vanilla"}


def replay(comm: FakeComm, name: str, sent: np.ndarray, round_: int = 0) -> np.ndarray:
    """What the job averages from this worker's ``sent`` (float64 sums, as the fake does)."""
    return ((sent.astype(np.float64) + comm.peers(name, round_, sent.size)) / comm.size()).astype(sent.dtype)


def _members(dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(7)
    a = torch.nn.Parameter(torch.zeros(3, 4, dtype=dtype, device=device))
    b = torch.nn.Parameter(torch.zeros(5, dtype=dtype, device=device))
    c = torch.nn.Parameter(torch.zeros(3, 4, dtype=dtype, device=device))
    grads = [torch.randn(3, 4, generator=gen, dtype=dtype), torch.randn(5, generator=gen, dtype=dtype),
             torch.randn(4, 3, generator=gen, dtype=dtype).t()]  # the last strided: not contiguous
    for p, g in zip((a, b, c), grads):
        p.grad = g.to(device)
    return [a, b, c]


# ---- bucket ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,views", [(torch.float32, True), (torch.float32, False), (torch.float64, True)])
def test_a_bucket_sends_members_in_order_and_hands_back_their_averages(dtype, views):
    comm = FakeComm()
    members = _members(dtype)
    carry = {id(members[1]): torch.full((5,), 2.0, dtype=dtype)}  # a residual handed over
    bucket = Bucket("g", members, None, 3, comm, views=views, carry=carry)
    held = [p.grad for p in members]
    flat = torch.cat([p.grad.reshape(-1) for p in members]).numpy().copy()
    flat[12:17] += 2.0
    for p in members:
        bucket.submit(p, p.grad)
    assert bucket.started and not carry, "the carried residual is added once"
    assert np.array_equal(comm.sent[0].tensor.numpy(), flat) and comm.sent[0].priority == 3
    out = bucket.finish()
    want = replay(comm, "g", flat)
    got = np.concatenate([out[id(p)].reshape(-1).numpy() for p in members])
    assert np.array_equal(got, want)
    if views:  # slices of the buffer: nothing copied out
        assert [_offset(bucket, out[id(p)]) for p in members] == [0, 12, 17]
        assert all(out[id(p)].shape == p.shape for p in members)
    else:  # written into each tensor's own memory
        assert all(out[id(p)] is g for p, g in zip(members, held))
        assert not out[id(members[2])].is_contiguous()


def _offset(bucket, t):
    start = bucket.buffer.data_ptr()
    end = start + bucket.buffer.numel() * bucket.buffer.element_size()
    return (t.data_ptr() - start) // t.element_size() if start <= t.data_ptr() < end else None


def test_tensors_left_in_their_views_are_not_copied_in(monkeypatch):
    comm = FakeComm()
    members = [torch.nn.Parameter(torch.zeros(n)) for n in (12, 5, 7)]
    bucket = Bucket("g", members, None, 0, comm, views=True)
    for p in members:
        bucket.submit(p, torch.ones(p.shape))
    views = bucket.finish()
    for v in views.values():  # zero_grad(set_to_none=False), then backward adds into them
        v.zero_().add_(3.0)

    concatenate = np.concatenate

    def no_copy(*args, **kwargs):
        if "out" in kwargs:  # (the fake job draws its peers with numpy too)
            raise AssertionError("copied tensors that were already in the buffer")
        return concatenate(*args, **kwargs)
    monkeypatch.setattr(np, "concatenate", no_copy)
    for p in members:
        bucket.submit(p, views[id(p)])
    assert torch.equal(comm.sent[1].tensor, torch.full((24,), 3.0))
    bucket.finish()


def test_tensors_some_left_in_their_views_some_new_go_into_the_buffer_each_once():
    """``zero_grad(set_to_none=False)`` left the views, but one gradient was replaced (a new
    tensor; ``backward(create_graph=True)`` makes one): a cat into the buffer would read
    the buffer itself (torch refuses it for float64, as for a GPU's tensors)."""
    comm = FakeComm()
    members = [torch.nn.Parameter(torch.zeros(n, dtype=torch.float64)) for n in (12, 5, 7)]
    bucket = Bucket("g", members, None, 0, comm, views=True)
    for p in members:
        bucket.submit(p, torch.ones(p.shape, dtype=torch.float64))
    views = bucket.finish()
    given = [views[id(members[0])].fill_(3.0), torch.full((5,), 4.0, dtype=torch.float64),
             views[id(members[2])].fill_(5.0)]
    given[2] = given[2].flip(0)  # a member's view in reverse: another tensor over the buffer's memory
    for p, t in zip(members, given):
        bucket.submit(p, t)
    want = torch.cat([torch.full((12,), 3.0), torch.full((5,), 4.0), torch.full((7,), 5.0)]).double()
    assert torch.equal(comm.sent[1].tensor, want)
    bucket.finish()


def test_the_copies_out_of_a_group_go_one_call_per_dtype_and_device(monkeypatch):
    """A group buffer of float32 copied out to float32 and bfloat16 members: CUDA's multi-
    tensor copy took its kernel from the first target's dtype in some torch releases."""
    from gradpress.pipeline.routes import bucket as bucket_module
    calls = []
    real = torch._foreach_copy_

    def one_kind(targets, sources):
        calls.append({(t.dtype, t.device) for t in targets})
        return real(targets, sources)
    monkeypatch.setattr(torch, "_foreach_copy_", one_kind)
    half = torch.bfloat16
    targets = [torch.zeros(3), torch.zeros(2, dtype=half), torch.zeros(4), torch.zeros(1, dtype=half)]
    sources = [torch.full((n,), float(i + 1)) for i, n in enumerate((3, 2, 4, 1))]
    bucket_module._copy_all(targets, sources)
    assert sorted(len(c) for c in calls) == [1, 1] and len(calls) == 2
    assert all(torch.equal(t.float(), s) for t, s in zip(targets, sources))


def test_a_bucket_of_one_sends_its_tensor_in_place_with_its_codec_and_lr():
    comm = FakeComm()
    p = torch.nn.Parameter(torch.zeros(40000))
    spec = CodecSpec.from_params(ONEBIT)
    bucket = Bucket("one", [p], spec, 0, comm, lr_of=lambda q: 0.5)
    g = torch.randn(40000)
    bucket.submit(p, g)
    assert comm.sent[0].spec == spec and comm.sent[0].lr == 0.5
    assert bucket.finish()[id(p)] is g and bucket.buffer is None


def test_a_bucket_refuses_to_start_without_every_member():
    bucket = Bucket("g", _members(), None, 0, FakeComm())
    bucket.submit(bucket.members[0], torch.zeros(3, 4))
    bucket.submit(bucket.members[1], torch.zeros(5))
    with pytest.raises(RuntimeError, match="1 member"):
        bucket.flush()


# ---- direct ------------------------------------------------------------------------------

def test_direct_sends_each_tensor_apart_with_its_own_spec():
    comm = FakeComm()
    a, b, c = (torch.nn.Parameter(torch.zeros(20000)) for _ in range(3))
    spec = CodecSpec.from_params(ONEBIT)
    auto = CodecSpec.from_params({"compressor": "auto"})
    names = {id(a): "G.a", id(b): "G.b", id(c): "G.c"}
    route = DirectRoute([a, b, c], names, {id(a): 0, id(b): -1, id(c): -2}, {id(a): spec, id(b): None, id(c): auto},
                        lambda p: 0.1, comm)
    grads = {id(p): torch.randn(20000) for p in (a, b, c)}
    sent = {pid: g.numpy().copy() for pid, g in grads.items()}
    for p in (a, b, c):
        route.submit(p, grads[id(p)])
    assert [(s.name, s.spec, s.lr) for s in comm.sent] == [("G.a", spec, 0.1), ("G.b", None, None), ("G.c", None, None)]
    assert set(route.finish(b)) == {id(b)}   # one member alone
    out = {id(b): grads[id(b)], **route.finish()}
    for p in (a, b, c):
        want = replay(comm, names[id(p)], sent[id(p)])
        assert out[id(p)] is grads[id(p)] and np.array_equal(out[id(p)].numpy(), want)


def test_direct_with_compression_fp16_sends_half_and_no_codec():
    comm = FakeComm()
    p = torch.nn.Parameter(torch.zeros(30000))
    spec = CodecSpec.from_params(ONEBIT)
    route = DirectRoute([p], {id(p): "G.p"}, {id(p): 0}, {id(p): spec}, lambda q: 0.1, comm, Compression.fp16)
    g = torch.randn(30000)
    route.submit(p, g)
    assert comm.sent[0].tensor.dtype == torch.float16 and comm.sent[0].spec is None
    out = route.finish()[id(p)]
    assert out.dtype == torch.float32
    half = g.to(torch.float16).numpy()
    assert np.array_equal(out.numpy(), replay(comm, "G.p", half).astype(np.float32))


# ---- rows --------------------------------------------------------------------------------

def test_the_density_vote_and_the_rows_route():
    comm = FakeComm(size=1)
    sparse, dense = torch.nn.Parameter(torch.zeros(10, 3)), torch.nn.Parameter(torch.zeros(10, 3))
    names = {id(sparse): "s", id(dense): "d"}
    vote = DensityVote(0.25, names, comm)
    g_sparse = torch.zeros(10, 3)
    g_sparse[4] = 1.0
    vote.consider(sparse, g_sparse)
    vote.consider(dense, torch.ones(10, 3))
    vote.consider(sparse, g_sparse)   # once per parameter
    empty = torch.nn.Parameter(torch.zeros(5, 0))  # rows of no width: no vote (it was moved to rows and failed)
    names[id(empty)] = "e"
    vote.consider(empty, torch.zeros(5, 0))
    assert [s.name for s in comm.sent] == ["SparseDensity.s", "SparseDensity.d"]
    assert vote.settle() == [id(sparse)] and vote.decided == {id(sparse): True, id(dense): False}
    route = RowsRoute({id(sparse): "Gradient.s"}, {id(sparse): 0}, comm)
    route.add(sparse, coo=False)
    route.submit(sparse, g_sparse)
    assert comm.sent[-1].name == "SparseGradient.s"
    assert route.finish()[id(sparse)] is g_sparse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_the_votes_count_is_the_row_kernels(dtype):
    g = torch.zeros(9, 2, 5, dtype=dtype)
    g[1, 1, 4] = 3.0
    g[4, 0, 0] = float("nan")   # NaN counts, as the row kernel counts it
    g[6] = -0.0                 # negative zero does not
    g[8, 1, 2] = -1e-3
    frac = nonzero_fraction(g)
    assert frac.dtype == torch.float64 and frac.shape == (1,)
    rows = extract(g.to(torch.float32).reshape(9, -1).numpy()).indices
    assert rows.tolist() == [1, 4, 8] and frac.item() == rows.shape[0] / 9


def test_a_devices_vote_is_counted_and_sent_from_the_device():
    """A GPU gradient's vote (here on ``meta``, a device that is not the host's) is counted
    where it lives and pushed from there: no row is found or copied to the host."""
    comm = FakeComm(size=1)
    p = torch.nn.Parameter(torch.zeros(10, 3, device="meta"))
    vote = DensityVote(0.25, {id(p): "m"}, comm)
    vote.consider(p, torch.zeros(10, 3, device="meta"))
    sent = comm.sent[0]
    assert sent.name == "SparseDensity.m" and sent.device.type == "meta"
    assert sent.tensor.dtype == torch.float64 and sent.tensor.shape == (1,)


# ---- lowrank -----------------------------------------------------------------------------

def test_lowrank_before_its_start_step_averages_every_tensor_uncompressed():
    comm = FakeComm()
    w, b = torch.nn.Parameter(torch.zeros(64, 64)), torch.nn.Parameter(torch.zeros(64))
    reducer = LowRankReducer([("w", w), ("b", b)], LowRankParams("acpsgd", 2, 5, 2.0, 0), "L.", comm=comm)
    route = LowRankRoute([w, b], reducer)
    gw, gb = torch.randn(64, 64), torch.randn(64)
    sw, sb = gw.numpy().copy(), gb.numpy().copy()
    route.submit(w, gw)
    route.submit(b, gb)
    assert comm.sent == [], "held until every member is in"
    out = route.finish()
    assert np.array_equal(out[id(w)].numpy().reshape(-1), replay(comm, "L.LowRank.full.w", sw.reshape(-1)))
    assert np.array_equal(out[id(b)].numpy(), replay(comm, "L.LowRank.raw", sb))
    assert sorted(reducer.key_names()) == ["L.LowRank.P", "L.LowRank.Q", "L.LowRank.full.w", "L.LowRank.raw"]


class FailingOnce(FakeComm):
    """The push_pulls of ``name`` fail once (a dead server, a deadline); notes every wait."""

    def __init__(self, name: str):
        super().__init__()
        self.failing, self.waited = name, []

    def wait(self, handle, timeout_s=None):
        self.waited.append(handle)
        out = super().wait(handle)
        if self.sent[handle - 1].name == self.failing:
            self.failing = None
            raise RuntimeError("push_pull of tensor 'L.LowRank.P': no reply within GRADPRESS_OP_TIMEOUT_S")
        return out


def test_after_a_failed_low_rank_step_its_uncompressed_bucket_starts_once_a_step_again():
    # the bucket of the small tensors was started before the factors' round failed: waited out
    # then (its clean-up runs), and the next step sends it once, not once per member
    comm = FailingOnce("L.LowRank.P")
    w, b, c = torch.nn.Parameter(torch.zeros(64, 64)), torch.nn.Parameter(torch.zeros(64)), \
        torch.nn.Parameter(torch.zeros(8))
    reducer = LowRankReducer([("w", w), ("b", b), ("c", c)], LowRankParams("powersgd", 2, 0, 2.0, 0), "L.", comm=comm)
    route = LowRankRoute([w, b, c], reducer)
    for p in (w, b, c):
        route.submit(p, torch.ones_like(p))
    with pytest.raises(RuntimeError, match="no reply"):
        route.finish()
    raw = [i + 1 for i, sent in enumerate(comm.sent) if sent.name == "L.LowRank.raw"]
    assert raw == [1] and raw[0] in comm.waited, "the started bucket was left pending"
    route.clear()   # (as the pipeline does after a failed step)
    for p in (w, b, c):
        route.submit(p, torch.ones_like(p))
    route.finish()
    assert [sent.name for sent in comm.sent].count("L.LowRank.raw") == 2, [sent.name for sent in comm.sent]


def test_a_failed_steps_started_push_pulls_are_waited_out_when_the_routes_clear():
    # a CUDA consumer's stream waits for what gradpress still writes into its tensors only in
    # the wait: a handle forgotten there leaves the next step writing under a landing
    comm = FakeComm()
    waited = []
    wait = comm.wait
    comm.wait = lambda handle, timeout_s=None: waited.append(handle) or wait(handle)
    a, b, c = _members()
    direct = DirectRoute([a, b], {id(a): "a", id(b): "b"}, {id(a): 0, id(b): 0}, {}, lambda p: 0.1, comm)
    bucket = Bucket("g", [c], None, 0, comm)
    direct.submit(a, a.grad)
    direct.submit(b, b.grad)
    bucket.submit(c, c.grad)
    direct.clear()
    bucket.clear()
    assert sorted(waited) == [1, 2, 3] and direct.finish() == {} and bucket.finish() == {}


def test_a_failed_steps_handles_are_waited_out_within_one_deadline_in_all():
    # a server that hangs (alive, heartbeats going on) holds each handle to its own deadline:
    # one after another, a step of many would report its error only after all of them
    from types import SimpleNamespace

    from gradpress.pipeline.routes import drain

    class Hung:
        settings = SimpleNamespace(op_timeout_s=0.3)

        def __init__(self):
            self.given = []

        def wait(self, handle, timeout_s=None):
            self.given.append(timeout_s)
            time.sleep(timeout_s)
            raise TimeoutError("no reply")
    comm = Hung()
    drain([1, 2, 3], comm)
    assert comm.given[0] <= 0.3 and comm.given[1:] == [0.0, 0.0], comm.given


# ---- planned -----------------------------------------------------------------------------

def _planned(comm, device="cpu", views=False):
    profile = synthetic_profile(4)
    params = [torch.nn.Parameter(torch.zeros(t.nbytes // 4, device=device)) for t in profile.tensors]
    names = {id(p): t.name for p, t in zip(params, profile.tensors)}
    priority = {id(p): t.priority for p, t in zip(params, profile.tensors)}
    plan = Plan(((0, 1), (2,)), ("onebit", "none"), 0.1, 1.0, low_rank=(3,), low_rank_option="acpsgd")
    options = {"onebit": ONEBIT, "none": {"compressor": "none"}, "acpsgd": {"compressor": "acpsgd", "rank": 2}}
    route = PlannedRoute(plan, profile, params, names, priority, lambda p: 0.2, options, 3, "lab", comm, views, 0)
    return route, params


def test_a_planned_route_sends_its_groups_and_factors_as_the_plan_says():
    comm = FakeComm()
    route, params = _planned(comm)
    assert [g.name for g in route.groups] == ["Plan3.0.t0", "Plan3.1.t2"]
    assert route.groups[0].spec == CodecSpec.from_params(ONEBIT) and route.groups[1].spec is None
    assert route.factored == [params[3]] and route.reducer.prefix == "Plan3.lab."
    grads = {id(p): torch.randn(p.shape) for p in params}
    raw = grads[id(params[2])].numpy().copy()
    for p in params:
        route.submit(p, grads[id(p)])
    out = route.finish()
    assert set(out) == {id(p) for p in params}
    assert np.array_equal(out[id(params[2])].numpy(), replay(comm, "Plan3.1.t2", raw))
    assert {g.name for g in route.groups} | set(route.reducer.key_names()) == set(route.key_names())


# ---- every route on the tensors' own device ------------------------------------------------

def test_every_route_allocates_and_sends_on_the_tensors_device():
    meta = torch.device("meta")
    comm = FakeComm()
    members = _members(device="meta")
    bucket = Bucket("g", members, None, 0, comm, carry={id(members[0]): torch.ones(12)})
    for p in members:
        bucket.submit(p, p.grad)
    bucket.finish()
    assert bucket.buffer.device == meta
    w, b = torch.nn.Parameter(torch.zeros(64, 64, device=meta)), torch.nn.Parameter(torch.zeros(64, device=meta))
    lowrank = LowRankRoute([w, b], LowRankReducer([("w", w), ("b", b)], LowRankParams("acpsgd", 2, 0, 2.0, 0), "L.",
                                                  comm=comm), carry={id(w): torch.ones(64 * 64)})
    for p in (w, b):
        lowrank.submit(p, torch.zeros(p.shape, device=meta))
    lowrank.finish()
    reducer = lowrank.reducer
    assert reducer.p.device == meta and reducer.matrices[0].error.device == meta
    route, params = _planned(comm, device="meta")
    for p in params:
        route.submit(p, torch.zeros(p.shape, device=meta))
    route.finish()
    assert all(g.buffer is None or g.buffer.device == meta for g in route.groups)
    assert route.reducer.p.device == meta and all(m.error.device == meta for m in route.reducer.matrices)
    assert {s.device for s in comm.sent} == {meta}, [(s.name, s.device) for s in comm.sent if s.device != meta]


# ---- half precision: compressed widened on its device, narrowed back ------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_tensor_is_compressed_widened_and_narrowed_back(dtype):
    comm = FakeComm()
    p = torch.nn.Parameter(torch.zeros(30000, dtype=dtype))
    spec = CodecSpec.from_params(ONEBIT)
    route = DirectRoute([p], {id(p): "G.p"}, {id(p): 0}, {id(p): spec}, lambda q: 0.1, comm)
    g = torch.randn(30000).to(dtype)
    wide = g.float().numpy().copy()
    route.submit(p, g)
    assert comm.sent[0].tensor.dtype == torch.float32 and comm.sent[0].spec == spec
    out = route.finish()[id(p)]
    assert out is g and out.dtype == dtype
    want = torch.from_numpy(replay(comm, "G.p", wide)).to(dtype)
    assert torch.equal(out, want), "not the float32 average, rounded once"


def test_a_bucket_with_a_codec_widens_half_members_and_a_raw_one_keeps_their_dtype():
    comm = FakeComm()
    members = [torch.nn.Parameter(torch.zeros(n, dtype=torch.float16)) for n in (3000, 5000)]
    spec = CodecSpec.from_params(ONEBIT)
    coded, raw = (Bucket(name, members, s, 0, comm) for name, s in (("coded", spec), ("raw", None)))
    for bucket in (coded, raw):
        grads = [torch.randn(p.shape).to(torch.float16) for p in members]
        for p, g in zip(members, grads):
            bucket.submit(p, g)
        out = bucket.finish()
        assert all(out[id(p)] is g and g.dtype == torch.float16 for p, g in zip(members, grads))
    assert coded.buffer.dtype == torch.float32 and comm.sent[0].spec == spec
    assert raw.buffer.dtype == torch.float16 and comm.sent[1].spec is None
    one = Bucket("one", members[:1], spec, 0, comm)   # a bucket of one half tensor: widened too
    one.submit(members[0], torch.ones(3000, dtype=torch.float16))
    one.finish()
    assert comm.sent[2].tensor.dtype == torch.float32


def test_compression_fp16_keeps_bfloat16_which_float16_would_overflow():
    big = torch.tensor([1e6, -3.0], dtype=torch.bfloat16)
    sent, ctx = Compression.fp16.compress(big)
    assert sent is big and Compression.fp16.decompress(sent, ctx) is big
    sent, ctx = Compression.fp16.compress(torch.tensor([1.5], dtype=torch.float32))
    assert sent.dtype == torch.float16 and Compression.fp16.decompress(sent, ctx).dtype == torch.float32


@pytest.mark.parametrize("dtypes,spec", [((torch.bfloat16, torch.bfloat16), ONEBIT),
                                         ((torch.float16, torch.float16), ONEBIT),
                                         ((torch.float32, torch.bfloat16), None)])
def test_compression_fp16_never_narrows_a_bucket_widened_for_its_half_members(dtypes, spec):
    """A bucket's float32 buffer that widened half members (for a codec, or beside float32
    ones) travels as it is under Compression.fp16, as the direct route sends such a tensor:
    cast to float16 it lost the codec, and bfloat16 members past 65504 came back inf."""
    comm = FakeComm()
    members = [torch.nn.Parameter(torch.zeros(4, dtype=d)) for d in dtypes]
    codec = CodecSpec.from_params(spec) if spec else None
    bucket = Bucket("g", members, codec, 0, comm, lr_of=lambda p: 0.1, views=True, compression=Compression.fp16)
    big = 1e5 if torch.bfloat16 in dtypes else 6e4
    grads = [torch.full((4,), big, dtype=dtypes[0]), torch.tensor([3.0, -2.0, 0.5, 1.0], dtype=dtypes[1])]
    wide = torch.cat([g.float() for g in grads]).numpy().copy()
    for p, g in zip(members, grads):
        bucket.submit(p, g)
    sent = comm.sent[0]
    assert sent.tensor.dtype == torch.float32 and sent.spec == codec
    assert np.array_equal(sent.tensor.numpy(), wide)
    out = bucket.finish()
    want = torch.from_numpy(replay(comm, "g", wide))
    for p, g, part in zip(members, grads, bucket.split(want)):
        assert out[id(p)].dtype == p.dtype and torch.isfinite(out[id(p)].float()).all()
        assert torch.equal(out[id(p)], part.to(p.dtype)), "not the float32 average, rounded once"


def test_a_compression_that_is_not_a_compressor_is_refused_and_fp16_beside_a_codec_is_said():
    """``compression="fp16"`` failed at the first backward, in a hook; Compression.fp16 with a
    codec sends float32 gradients without it, which only the docs said."""
    with pytest.raises(TypeError, match="compression='fp16' is not a compressor"):
        check_compression("fp16", None, "DistributedOptimizer")
    with pytest.warns(UserWarning, match=r"float16 without its codec \(onebit\)"):
        check_compression(Compression.fp16, {"compressor": "onebit"}, "DistributedOptimizer")
    check_compression(Compression.none, {"compressor": "onebit"}, "DistributedOptimizer")
