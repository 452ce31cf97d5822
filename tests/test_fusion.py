"""gradpress/torch/fusion.py's copies: gradients into a group's flat buffer in member order,
and the group's result back into them, for contiguous and strided gradients, through numpy
(host float32) and through torch (anything else). The push_pull in between is replaced by
one that halves the buffer and records what it was given; the integration tests
(test_auto_plan_integ.py) run the same groups through real servers."""
import pytest
import torch

from gradpress.torch import fusion


@pytest.fixture
def halving_push_pull(monkeypatch):
    sent = {}

    def push_pull_async_inplace(tensor, average, name, priority, compression_params, lr):
        sent[name] = tensor.clone()
        tensor.mul_(0.5)
        return name

    monkeypatch.setattr(fusion.ops, "push_pull_async_inplace", push_pull_async_inplace)
    monkeypatch.setattr(fusion.ops, "synchronize", lambda handle: fusion_buffers[handle])
    fusion_buffers = {}
    return sent, fusion_buffers


def _members(dtype):
    a = torch.nn.Parameter(torch.zeros(3, 4, dtype=dtype))
    b = torch.nn.Parameter(torch.zeros(5, dtype=dtype))
    c = torch.nn.Parameter(torch.zeros(4, 3, dtype=dtype))
    gen = torch.Generator().manual_seed(7)
    a.grad = torch.randn(3, 4, generator=gen, dtype=dtype)
    b.grad = torch.randn(5, generator=gen, dtype=dtype)
    c.grad = torch.randn(3, 4, generator=gen, dtype=dtype).t()  # strided: not contiguous
    return [a, b, c]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_go_out_in_member_order_and_come_back_averaged(halving_push_pull, dtype):
    sent, buffers = halving_push_pull
    members = _members(dtype)
    before = [p.grad.clone() for p in members]
    assert not members[2].grad.is_contiguous()
    group = fusion.FusedGroup("g", members, None, 0, {})
    assert fusion._on_host_float32([p.grad for p in members]) == (dtype == torch.float32)
    group.start({id(members[1]): torch.full((5,), 2.0, dtype=dtype)})  # a carried residual
    before[1] += 2.0
    buffers["g"] = group.buffer
    want = torch.cat([g.reshape(-1).to(torch.float32) for g in before])
    assert torch.equal(sent["g"], want)
    group.finish()
    for p, g in zip(members, before):
        assert torch.equal(p.grad, (g.to(torch.float32) * 0.5).to(dtype)), p.shape
    assert not members[2].grad.is_contiguous()  # written into its own memory


def test_a_missing_gradient_travels_as_zeros(halving_push_pull):
    sent, buffers = halving_push_pull
    members = _members(torch.float32)
    members[1].grad = None
    group = fusion.FusedGroup("g", members, None, 0, {})
    group.start({})
    buffers["g"] = group.buffer
    assert torch.equal(sent["g"][12:17], torch.zeros(5))
    group.finish()
    assert torch.equal(members[1].grad, torch.zeros(5))
