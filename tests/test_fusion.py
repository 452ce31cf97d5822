"""gradpress/torch/fusion.py's copies: gradients into a group's flat buffer in member order,
for contiguous and strided gradients, through numpy (host float32) and through torch
(anything else); the group's result handed back as views of the buffer (host float32,
contiguous parameters) or copied into each gradient's own memory (anything else); and no
copy in for gradients still in those views. The push_pull in between is replaced by
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


@pytest.mark.parametrize("dtype,views", [(torch.float32, True), (torch.float32, False), (torch.float64, True)])
def test_gradients_go_out_in_member_order_and_come_back_averaged(halving_push_pull, dtype, views):
    sent, buffers = halving_push_pull
    members = _members(dtype)
    before = [p.grad.clone() for p in members]
    held = [p.grad for p in members]  # what a caller holding the gradients across the push_pull sees
    assert not members[2].grad.is_contiguous()
    group = fusion.FusedGroup("g", members, None, 0, {}, views=views)
    assert fusion._on_host_float32([p.grad for p in members]) == (dtype == torch.float32)
    group.start({id(members[1]): torch.full((5,), 2.0, dtype=dtype)})  # a carried residual
    before[1] += 2.0
    buffers["g"] = group.buffer
    want = torch.cat([g.reshape(-1).to(torch.float32) for g in before])
    assert torch.equal(sent["g"], want)
    group.finish()
    for p, g in zip(members, before):
        assert torch.equal(p.grad, (g.to(torch.float32) * 0.5).to(dtype)), p.shape
    if dtype == torch.float32 and views:  # each gradient is now its slice of the buffer: nothing copied out
        assert [_offset(group, p.grad) for p in members] == [0, 12, 17]
        assert all(p.grad.shape == p.shape and p.grad.is_contiguous() for p in members)
    else:  # written into its own memory: a caller holding it sees the average
        assert all(p.grad is g for p, g in zip(members, held))
        assert all(_offset(group, p.grad) is None for p in members)
        assert not members[2].grad.is_contiguous()


def _offset(group, grad):
    """Where ``grad`` lies in the group's buffer, in elements; None when it is elsewhere."""
    start = group.buffer.data_ptr()
    end = start + group.buffer.numel() * group.buffer.element_size()
    return (grad.data_ptr() - start) // 4 if start <= grad.data_ptr() < end else None


def test_gradients_left_in_their_views_are_not_copied_in(halving_push_pull, monkeypatch):
    """``zero_grad(set_to_none=False)`` and backward accumulate into the views: the next
    round sends them as they lie; a member whose gradient was replaced is copied in."""
    sent, buffers = halving_push_pull
    members = _members(torch.float32)
    group = fusion.FusedGroup("g", members, None, 0, {}, views=True)
    group.start({})
    buffers["g"] = group.buffer
    group.finish()
    views = [p.grad for p in members]
    for p in members:
        p.grad.zero_()
        p.grad.add_(torch.arange(p.numel(), dtype=torch.float32).view_as(p) + 1)

    def no_copy(*args, **kwargs):
        raise AssertionError("copied gradients that were already in the buffer")

    with monkeypatch.context() as m:
        m.setattr(fusion.np, "concatenate", no_copy)
        group.start({id(members[0]): torch.full((12,), 10.0)})
    want = torch.cat([torch.arange(n, dtype=torch.float32) + 1 for n in (12, 5, 12)])
    want[:12] += 10.0
    assert torch.equal(sent["g"], want)
    group.finish()
    assert all(p.grad.data_ptr() == v.data_ptr() for p, v in zip(members, views))
    assert torch.equal(members[0].grad.reshape(-1), want[:12] * 0.5)

    members[1].grad = torch.full((5,), 4.0)  # set to None and computed afresh, say
    group.start({})
    assert torch.equal(sent["g"], torch.cat([want[:12] * 0.5, torch.full((5,), 4.0), want[17:] * 0.5]))
    group.finish()
    assert _offset(group, members[1].grad) == 12 and torch.equal(members[1].grad, torch.full((5,), 2.0))


def test_a_parameter_that_is_not_contiguous_keeps_its_own_gradient_memory(halving_push_pull):
    sent, buffers = halving_push_pull
    members = _members(torch.float32)
    members[0] = torch.nn.Parameter(torch.zeros(4, 3).t())  # a (3, 4) parameter, transposed
    members[0].grad = torch.ones(3, 4)
    own = members[0].grad.data_ptr()
    group = fusion.FusedGroup("g", members, None, 0, {}, views=True)
    group.start({})
    buffers["g"] = group.buffer
    group.finish()
    assert members[0].grad.data_ptr() == own and torch.equal(members[0].grad, torch.full((3, 4), 0.5))
    assert _offset(group, members[1].grad) is None


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
