"""Adam's arithmetic over lists (``optim/adam_math``): the same bits as one tensor at a time,
in a number of torch ops that does not grow with the number of tensors."""
import pytest
import torch

from gradpress.optim import adam_math
from gradpress.optim.momentum_codecs import floored_denominator
from gradpress.testing.torch_ops import ops_of

B1, B2, EPS, FLOOR = 0.9, 0.999, 1e-8, 0.1


def tensors(seed: int, shapes, positive: bool = False, dtype=torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(s, generator=g) for s in shapes]
    return [(t.abs() * 1e-3 if positive else t).to(dtype) for t in out]


SHAPES = [(7, 5), (33,), (1,), (64, 3), (2, 2, 2)]


def test_each_function_gives_the_bits_of_one_tensor_at_a_time():
    """The references are the per-parameter code the optimizers ran before."""
    ms, vs, gs, ps = (tensors(s, SHAPES, positive=(s == 2)) for s in range(1, 5))
    got = adam_math.momenta(ms, gs, B1)
    assert all(torch.equal(a, torch.mul(m, B1).add_(g, alpha=1 - B1)) for a, m, g in zip(got, ms, gs))

    m2, v2 = [m.clone() for m in ms], [v.clone() for v in vs]
    adam_math.accumulate(m2, v2, gs, B1, B2)
    for a, b, m, v, g in zip(m2, v2, ms, vs, gs):
        assert torch.equal(a, m.clone().mul_(B1).add_(g, alpha=1 - B1))
        assert torch.equal(b, v.clone().mul_(B2).addcmul_(g, g, value=1 - B2))

    bias2s = [None, 0.3, None, 0.02, 0.5]
    for floor in (0.0, FLOOR):
        got = adam_math.denominators(vs, bias2s, EPS, floor)
        for d, v, b in zip(got, vs, bias2s):
            root = (v if b is None else v / b).sqrt()
            if floor:
                root = torch.maximum(root, floor * root.mean())
            assert torch.equal(d, root + EPS), (floor, b)
            assert torch.equal(d, floored_denominator(v if b is None else v / b, floor, EPS))
            if not floor and b is not None:  # OneBitAdam's warm-up wrote it this way
                assert torch.equal(d, (v / b).sqrt_().add_(EPS))

    denoms = adam_math.denominators(vs, [None] * 5, EPS)
    bias1s = [0.1, 0.19, 0.271, 0.5, 1.0]
    for wd in (0.0, 0.01):
        p2 = [p.clone() for p in ps]
        adam_math.apply(p2, ms, denoms, bias1s, 0.003, wd)
        for a, p, m, d, b in zip(p2, ps, ms, denoms, bias1s):
            update = m / b / d
            if wd:
                update.add_(p, alpha=wd)
            assert torch.equal(a, p.clone().add_(update, alpha=-0.003)), wd


def test_a_sparse_gradient_adds_to_m_as_rows_and_to_v_dense():
    """An embedding's sparse average in a warm-up or variance step: torch has no sparse
    addcmul, so v takes it dense (the optimizers failed there before)."""
    m, v = tensors(5, [(6, 3)]), tensors(6, [(6, 3)], positive=True)
    rows = torch.sparse_coo_tensor(torch.tensor([[4, 1, 4]]), torch.randn(3, 3), (6, 3), check_invariants=True)
    m2, v2 = [m[0].clone()], [v[0].clone()]
    adam_math.accumulate(m2, v2, [rows], B1, B2)
    dense = rows.to_dense()
    assert torch.equal(m2[0], m[0].clone().mul_(B1).add_(rows, alpha=1 - B1))
    assert torch.equal(v2[0], v[0].clone().mul_(B2).addcmul_(dense, dense, value=1 - B2))
    assert torch.equal(v2[0][0], v[0][0] * B2), "a row with no gradient only decays"
    (sent,) = adam_math.momenta(m, [rows], B1)
    assert torch.equal(sent, torch.mul(m[0], B1).add_(rows, alpha=1 - B1))


@pytest.mark.parametrize("n", [3, 40])
def test_the_ops_do_not_grow_with_the_tensors(n):
    """On a GPU each op is a launch: a step's arithmetic costs the same few for 3 tensors or 40
    (the floor's mean and clamp, one op a tensor each, are the exception, counted apart)."""
    shapes = [(5, 4)] * n
    ms, vs, gs, ps = (tensors(s, shapes, positive=(s == 2)) for s in range(1, 5))
    counts = {}
    for name, run in {"momenta": lambda: adam_math.momenta(ms, gs, B1),
                      "accumulate": lambda: adam_math.accumulate(ms, vs, gs, B1, B2),
                      "denominators": lambda: adam_math.denominators(vs, [0.5] * n, EPS),
                      "apply": lambda: adam_math.apply(ps, ms, vs, [0.5] * n, 0.01, 0.01)}.items():
        counts[name] = ops_of(run)
    assert counts == {"momenta": 2, "accumulate": 4, "denominators": 3, "apply": 4}
    # a mean and a clamp per tensor; the floors stacked and scaled
    assert ops_of(lambda: adam_math.denominators(vs, [0.5] * n, EPS, FLOOR)) == 5 + 2 * n
    one = ops_of(lambda: adam_math.denominators(vs[:1], [0.5], EPS, FLOOR))
    assert one == 6, "one tensor (a host's way) makes its floor without a stack"


class _OnAnotherDevice(torch.Tensor):
    """A meta tensor that says it is on a second GPU (the host has none)."""
    @property
    def device(self):
        return torch.device("cuda", 1)


def _places(parts: list[list[torch.Tensor]], ts: list[torch.Tensor]) -> list[list[int]]:
    where = {id(t): i for i, t in enumerate(ts)}
    return [[where[id(t)] for t in part] for part in parts]


def test_chunks_bound_the_bytes_of_each_list_on_a_device_and_are_single_tensors_on_a_host():
    # meta tensors stand for a GPU's: a device that is not the host
    ts = [torch.empty(n, device="meta") for n in (10, 10, 30, 5, 100, 1)]  # 40, 40, 120, 20, 400, 4 bytes
    assert _places(adam_math.chunks(ts, 100), ts) == [[0, 1], [2], [3], [4], [5]]
    assert _places(adam_math.chunks(ts, 200), ts) == [[0, 1, 2], [3], [4], [5]]
    assert _places(adam_math.chunks(ts), ts) == [list(range(6))]
    assert adam_math.chunks([]) == []
    assert sorted(i for part in _places(adam_math.chunks(ts, 1), ts) for i in part) == list(range(6))
    # a group spread over two devices: a chunk never spans them (meta and a stand-in's)
    two = [torch.empty(10, device="meta"), torch.empty(10, device="meta")]
    other = torch.Tensor._make_subclass(_OnAnotherDevice, torch.empty(10, device="meta"))
    spread = two + [other, torch.empty(10, device="meta")]
    assert _places(adam_math.chunks(spread), spread) == [[0, 1, 3], [2]]
    host = [torch.empty(n) for n in (10, 10, 30)]
    assert _places(adam_math.chunks(host), host) == [[0], [1], [2]]
    mixed = ts[:2] + host[:1]
    assert _places(adam_math.chunks(mixed), mixed) == [[0], [1], [2]]


def test_chunks_hold_one_dtype_each_in_the_order_of_each_dtype():
    """A half model with float32 norms: CUDA's ``_foreach_copy_`` took its kernel from the
    first target's dtype in some torch releases, and a parameter gets its update copied in."""
    kinds = [torch.float16, torch.float32, torch.float16, torch.bfloat16, torch.float32, torch.float16]
    ts = [torch.empty(10, dtype=k, device="meta") for k in kinds]
    assert _places(adam_math.chunks(ts), ts) == [[0, 2, 5], [1, 4], [3]]
    assert _places(adam_math.chunks(ts, 40), ts) == [[0, 2], [5], [1], [4], [3]]


def test_copies_are_the_gradients_bits_in_new_tensors_in_one_copy():
    """What a warm-up or variance step sends: each gradient's copy (a sparse one too), in
    fresh memory with the gradient's strides, all the dense ones in one op besides their
    allocations (on a GPU one launch, where a clone each was a launch each)."""
    gs = tensors(7, SHAPES) + [torch.tensor([-0.0, float("nan"), 1e-40, -float("inf")]), torch.randn(4, 6).t()]
    rows = torch.sparse_coo_tensor(torch.tensor([[2, 0]]), torch.randn(2, 3), (5, 3), check_invariants=True)
    got = adam_math.copies(gs + [rows])
    for a, g in zip(got, gs):
        assert a.dtype == g.dtype and a.stride() == g.stride() and a.data_ptr() != g.data_ptr()
        assert a.view(torch.int32).equal(g.view(torch.int32)) if g.is_contiguous() else torch.equal(a, g)
    assert got[-1].is_sparse and torch.equal(got[-1].to_dense(), rows.to_dense())
    assert got[-1]._values().data_ptr() != rows._values().data_ptr()
    allocations = ops_of(lambda: [torch.empty_like(g) for g in gs])
    assert ops_of(lambda: adam_math.copies(gs)) == allocations + 1
    assert adam_math.copies([]) == []


def test_copies_go_one_multi_tensor_copy_per_dtype(monkeypatch):
    gs = [torch.randn(5).to(k) for k in (torch.float16, torch.float32, torch.float16, torch.bfloat16)]
    calls = []
    real = torch._foreach_copy_

    def recorded(dst, src):
        calls.append(([t.dtype for t in dst], [t.dtype for t in src]))
        return real(dst, src)
    monkeypatch.setattr(torch, "_foreach_copy_", recorded)
    got = adam_math.copies(gs)
    assert calls == [([torch.float16] * 2, [torch.float16] * 2), ([torch.float32], [torch.float32]),
                     ([torch.bfloat16], [torch.bfloat16])]
    assert all(a.dtype == g.dtype and torch.equal(a, g) for a, g in zip(got, gs))


def test_empty_lists_run_no_op():
    def run():
        assert adam_math.momenta([], [], B1) == []
        adam_math.accumulate([], [], [], B1, B2)
        assert adam_math.denominators([], [], EPS, FLOOR) == []
        adam_math.apply([], [], [], [], 0.1, 0.1)
    assert ops_of(run) == 0


def test_a_half_precision_parameters_adam_state_is_float32():
    """In bfloat16 Adam's variance never decays: 0.999 v rounds back to v (8 bits of mantissa);
    in float16 eps is 0. A parameter of either keeps its state in float32; others their own."""
    from gradpress.optim.momentum_codecs import ensure_state, state_dtype
    v = torch.tensor([1.0, 3.0, 0.02], dtype=torch.bfloat16)
    assert torch.equal(v * 0.999, v)
    for dtype, kept in ((torch.float16, torch.float32), (torch.bfloat16, torch.float32),
                        (torch.float32, torch.float32), (torch.float64, torch.float64)):
        p, state = torch.nn.Parameter(torch.zeros(3, dtype=dtype)), {}
        ensure_state(state, p)
        assert state_dtype(p) == kept and state["exp_avg"].dtype == state["exp_avg_sq"].dtype == kept
