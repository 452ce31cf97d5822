"""Folding the wrapped optimizer's momentum into the codecs' (``momentum: "nesterov"``,
gradpress/torch/folded_momentum.py), on the parameter table alone; a real job's trajectory,
through a skipped step and a checkpoint, is tests/torch/test_folded_momentum_integ.py."""
import pytest
import torch

from gradpress.compressors.policy import CompressionPolicy
from gradpress.pipeline import ParameterTable
from gradpress.torch.compression import Compression
from gradpress.torch.folded_momentum import FoldedMomentum

NESTEROV = {"compressor": "onebit", "scaling": True, "ef": "vanilla", "momentum": "nesterov"}


def _param(n, dtype=torch.float32):
    return torch.nn.Parameter(torch.zeros(n, dtype=dtype))


def _folded(named, groups, rules=(), compression=Compression.none, routes=None):
    policy = CompressionPolicy(NESTEROV, list(rules), min_bytes=65536)
    table = ParameterTable([p for _, p in named], named, policy)
    folded = FoldedMomentum(table, compression, route_of=lambda p: (routes or {}).get(id(p), "direct"))
    folded.fold(groups, table.trainable)
    return table, folded


def _mu(table, p):
    return table.spec[id(p)].compression_params.get("mu")


def test_every_compressed_member_of_a_group_takes_its_momentum_and_the_others_keep_it_as_folded():
    """Each compressed gradient of a group gets the group's momentum as mu (the second one got
    the codec's default 0.9: the first had set the group's to 0), and the group's other
    gradients, which travel uncompressed, keep it as folded momentum (they had none)."""
    w1, w2, h, small, exempt = _param(20000), _param(20000), _param(40000, torch.bfloat16), _param(10), _param(20000)
    other, own = _param(20000), _param(20000)
    groups = [{"params": [w1, w2, h, small, exempt], "momentum": 0.5},
              {"params": [other], "momentum": 0.0}, {"params": [own], "momentum": 0.7}]
    named = [("w1", w1), ("w2", w2), ("h", h), ("small", small), ("exempt", exempt), ("other", other), ("own", own)]
    table, folded = _folded(named, groups, rules=[("exempt", {"compressor": "none"}),
                                                  ("own", {"compressor": "topk", "k": 0.1})])
    assert [_mu(table, p) for p in (w1, w2, h)] == [0.5] * 3, "a half gradient is widened for its codec: it carries it"
    assert groups[0]["momentum"] == 0 and folded.groups == {0: 0.5}
    assert {pid: mu for pid, (_, mu) in folded.raw.items()} == {id(small): 0.5, id(exempt): 0.5}
    assert _mu(table, other) is None, "a group without momentum: the codec's own"
    assert groups[2]["momentum"] == 0.7, "a group none of whose gradients carries momentum keeps its own"


def test_compression_fp16_sends_float32_gradients_without_their_codec_so_the_group_keeps_its_momentum():
    w, h = _param(20000), _param(40000, torch.float16)
    groups = [{"params": [w], "momentum": 0.5}, {"params": [h], "momentum": 0.6}]
    table, folded = _folded([("w", w), ("h", h)], groups, compression=Compression.fp16)
    assert groups[0]["momentum"] == 0.5, "w travels as float16 without its codec: torch's momentum stays"
    assert groups[1]["momentum"] == 0 and _mu(table, h) == 0.6 and folded.groups == {1: 0.6}


def test_parameters_that_join_later_are_folded_as_their_group_was_and_a_new_group_is_folded_too():
    w, late_w, late_b, new_w, new_b = _param(20000), _param(20000), _param(10), _param(20000), _param(10)
    for p in (late_w, late_b):
        p.requires_grad_(False)
    groups = [{"params": [w, late_w, late_b], "momentum": 0.5}]
    named = [("w", w), ("late_w", late_w), ("late_b", late_b), ("new_w", new_w), ("new_b", new_b)]
    table, folded = _folded(named, groups)
    for p in (late_w, late_b):  # unfrozen (DistributedOptimizer's _adopt_late adopts them, then folds)
        p.requires_grad_(True)
    groups.append({"params": [new_w, new_b], "momentum": 0.8})  # add_param_group, momentum from the defaults
    for name, p in named[1:]:
        table.adopt(p, name)
    folded.fold(groups, [late_w, late_b, new_w, new_b])
    assert _mu(table, late_w) == 0.5 and folded.raw[id(late_b)][1] == 0.5, "the group's momentum, not 0.9 or none"
    assert groups[1]["momentum"] == 0 and _mu(table, new_w) == 0.8 and folded.raw[id(new_b)][1] == 0.8


def test_a_momentum_set_again_is_folded_back_and_a_gradient_moved_to_the_rows_route_keeps_its_mu():
    w, b = _param(20000), _param(10)
    groups = [{"params": [w, b], "momentum": 0.5}]
    routes = {}
    table, folded = _folded([("w", w), ("b", b)], groups, routes=routes)
    groups[0]["momentum"] = 0.5  # a checkpoint of the group as built
    folded.keep_folded(groups, loaded=True)
    assert groups[0]["momentum"] == 0
    groups[0]["momentum"] = 0.95  # an LR scheduler cycling momentum
    with pytest.warns(UserWarning, match="param group 0's momentum was set to 0.95"):
        folded.keep_folded(groups)
    assert groups[0]["momentum"] == 0
    assert [p for p, _ in folded._members()] == [b]
    routes[id(w)] = "rows"  # the density vote moved it: it travels without its codec now
    assert [(p, mu) for p, mu in folded._members()] == [(b, 0.5), (w, 0.5)]


class _Stepped(torch.optim.SGD):
    """An SGD whose step runs under the folded momentum, as DistributedOptimizer's does."""

    def __init__(self, params, folded, **kwargs):
        super().__init__(params, **kwargs)
        self.folded = folded

    def step(self, closure=None):
        with self.folded.applied(self):
            return super().step(closure)


@pytest.mark.parametrize("fused", [False, True])
def test_the_folded_momentum_is_torchs_nesterov_and_a_scaler_skips_it_with_the_step(fused):
    """On the average, as torch's SGD with Nesterov momentum; under a GradScaler, a fused SGD
    (handed scaled gradients and found_inf) and an unfused one (unscaled first, its step not
    called) both leave the momentum where it was on an overflowing step."""
    w, b, ref = _param(20000), _param(5), _param(5)
    table, folded = _folded([("w", w), ("b", b)], [{"params": [w, b], "momentum": 0.5}])
    opt = _Stepped([b], folded, lr=0.1, fused=fused)  # (w's gradient carries its codec's momentum)
    reference = torch.optim.SGD([ref], lr=0.1, momentum=0.5, nesterov=True, fused=fused)
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0 ** 4) for _ in range(2)]
    for step in range(5):
        g = torch.linspace(-1.0, 1.0, 5) * (step + 1)
        if step == 2:
            g[1] = float("inf")
        for p, o, scaler in ((b, opt, scalers[0]), (ref, reference, scalers[1])):
            p.grad = g * scaler.scale(torch.tensor(1.0))  # (what scaler.scale(loss).backward() would give)
            held = p.grad
            scaler.step(o)
            scaler.update()
            assert p.grad is held, "the gradient is the parameter's own again"
        torch.testing.assert_close(b.detach(), ref.detach(), rtol=1e-6, atol=1e-7, msg=f"step {step}")
        assert torch.isfinite(folded.buffers[id(b)]).all()
    restored = _folded([("w", w), ("b", b)], [{"params": [w, b], "momentum": 0.5}])[1]
    saved = {"param_groups": [{}]}
    folded.save(saved)
    assert saved["param_groups"][0]["momentum"] == 0.5, "a plain torch optimizer loads the momentum it was built with"
    restored.load_state_dict(saved["gradpress_folded_momentum"], [{"params": [w, b], "momentum": 0.5}])
    assert torch.equal(restored.buffers[id(b)], folded.buffers[id(b)])
    with pytest.raises(ValueError, match=r"folded momentum of \['q'\].*gradpress_folded_momentum"):
        restored.load_state_dict({"q": torch.zeros(5)}, [])
