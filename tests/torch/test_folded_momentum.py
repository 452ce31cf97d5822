"""Folding the wrapped optimizer's momentum into the codecs' (``momentum: "nesterov"``,
gradpress/torch/folded_momentum.py), on the parameter table alone; a real job's trajectory
is tests/torch/test_folded_momentum_integ.py."""
import pytest
import torch

from gradpress.compressors.policy import CompressionPolicy
from gradpress.pipeline import ParameterTable
from gradpress.torch.compression import Compression
from gradpress.torch.folded_momentum import FoldedMomentum

NESTEROV = {"compressor": "onebit", "scaling": True, "ef": "vanilla", "momentum": "nesterov"}


def _table(groups, rules=(), default=NESTEROV):
    named = [(n, p) for group in groups for n, p in group]
    policy = CompressionPolicy(default, list(rules), min_bytes=65536)
    return ParameterTable([p for _, p in named], named, policy)


def _param(n, dtype=torch.float32):
    return torch.nn.Parameter(torch.zeros(n, dtype=dtype))


def test_every_compressed_member_of_a_group_takes_its_momentum_and_the_others_keep_it_as_folded():
    """Each compressed gradient of a group gets the group's momentum as mu (the second one got
    the codec's default 0.9: the first had set the group's to 0), and the group's other
    gradients, which travel uncompressed, keep it as folded momentum (they had none)."""
    w1, w2, h, small, exempt = _param(20000), _param(20000), _param(40000, torch.bfloat16), _param(10), _param(20000)
    other, own = _param(20000), _param(20000)
    groups = [{"params": [w1, w2, h, small, exempt], "momentum": 0.5},
              {"params": [other], "momentum": 0.0},
              {"params": [own], "momentum": 0.7}]
    table = _table([[("w1", w1), ("w2", w2), ("h", h), ("small", small), ("exempt", exempt)],
                    [("other", other)], [("own", own)]],
                   rules=[("exempt", {"compressor": "none"}), ("own", {"compressor": "topk", "k": 0.1})])
    folded = FoldedMomentum.fold(table, groups, Compression.none)
    mu = {n: table.spec[id(p)].compression_params.get("mu") for n, p in [("w1", w1), ("w2", w2), ("h", h)]}
    assert mu == {"w1": 0.5, "w2": 0.5, "h": 0.5}, "a half gradient is widened for its codec: it carries it too"
    assert groups[0]["momentum"] == 0
    assert folded.mu == {id(small): 0.5, id(exempt): 0.5}
    assert table.spec[id(other)].compression_params.get("mu") is None, "a group without momentum: the codec's own"
    assert groups[2]["momentum"] == 0.7, "a group none of whose gradients carries momentum keeps its own"


def test_compression_fp16_sends_float32_gradients_without_their_codec_so_the_group_keeps_its_momentum():
    w, h = _param(20000), _param(40000, torch.float16)
    groups = [{"params": [w], "momentum": 0.5}, {"params": [h], "momentum": 0.6}]
    table = _table([[("w", w)], [("h", h)]])
    assert FoldedMomentum.fold(table, groups, Compression.fp16) is None
    assert groups[0]["momentum"] == 0.5, "w travels as float16 without its codec: torch's momentum stays"
    assert groups[1]["momentum"] == 0 and table.spec[id(h)].compression_params["mu"] == 0.6


def test_the_folded_momentum_is_torchs_nesterov_on_each_step_and_the_gradient_comes_back():
    p, ref = _param(5), _param(5)
    folded = FoldedMomentum({id(p): 0.5}, {id(p): "p"})
    sgd = torch.optim.SGD([p], lr=0.1)
    reference = torch.optim.SGD([ref], lr=0.1, momentum=0.5, nesterov=True)
    for step in range(4):
        g = torch.linspace(-1.0, 1.0, 5) * (step + 1)
        p.grad, ref.grad = g.clone(), g.clone()
        held = p.grad
        with folded.applied([p]):
            sgd.step()
        assert p.grad is held and torch.equal(held, g), "the gradient is the parameter's own again"
        reference.step()
        assert torch.equal(p, ref), f"step {step}"
    restored = FoldedMomentum({id(p): 0.5}, {id(p): "p"})
    restored.load_state_dict(folded.state_dict(), [p])
    assert torch.equal(restored.buffers[id(p)], reference.state[ref]["momentum_buffer"])
    with pytest.raises(ValueError, match=r"folded momentum of \['q'\].*gradpress_folded_momentum"):
        restored.load_state_dict({"q": torch.zeros(5)}, [p])
