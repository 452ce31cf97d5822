"""A broadcast whose root is not a worker of the job is refused before anything moves: with
no root, every worker would push zeros and get zeros back, the parameters all wiped."""
import pytest
import torch

import gradpress.torch as bps
from gradpress.torch import ops


@pytest.fixture
def two_workers(monkeypatch):
    monkeypatch.setattr(ops, "size", lambda: 2)
    monkeypatch.setattr(ops, "rank", lambda: 1)

    def no_push_pull(*args, **kwargs):
        raise AssertionError("a push_pull started for a broadcast that should have been refused")
    monkeypatch.setattr(ops, "push_pull_async_inplace", no_push_pull)
    monkeypatch.setattr(ops, "push_pull", no_push_pull, raising=False)


@pytest.mark.parametrize("root", [2, -1, 7, True, "0", 0.0, None])
def test_a_root_outside_the_job_is_refused_and_nothing_is_zeroed(two_workers, root):
    model = torch.nn.Linear(3, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"broadcast_parameters: root_rank=.* is not a worker's rank \(0 to 1\)"):
        bps.broadcast_parameters(model.state_dict(), root_rank=root)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    with pytest.raises(ValueError, match="broadcast_object: root_rank="):
        bps.broadcast_object({"epoch": 3}, root_rank=root)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="broadcast_optimizer_state: root_rank="):
        bps.broadcast_optimizer_state(optimizer, root_rank=root)


def test_tied_weights_are_broadcast_once_under_their_first_name(monkeypatch):
    """A language model's embedding and output layer over one tensor are two keys of its
    ``state_dict``: pushed twice, a worker's second push would read the root's value that the
    first had landed, and every worker would get it times the workers."""
    monkeypatch.setattr(ops, "size", lambda: 2)
    monkeypatch.setattr(ops, "rank", lambda: 0)
    pushed = []
    monkeypatch.setattr(ops, "push_pull_async_inplace", lambda t, average, name: pushed.append(name) or name)
    monkeypatch.setattr(ops, "synchronize", lambda handle: None)
    model = torch.nn.Sequential(torch.nn.Embedding(6, 4), torch.nn.Linear(4, 6, bias=False), torch.nn.Linear(6, 6))
    model[1].weight = model[0].weight
    model[2].weight.data = model[0].weight.data.t()   # the same memory in another shape: not an alias
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    assert pushed == ["Parameter.0.weight", "Parameter.2.bias", "Parameter.2.weight"]


def test_the_roots_device_hyper_parameters_land_on_this_workers_device():
    """A learning rate kept as a GPU tensor (capturable or fused Adam) travels through the
    host; a worker puts it back on its own device of that type (``meta`` stands in for a GPU
    here): the local value's, else the group's parameters', and a host tensor stays there."""
    from types import SimpleNamespace

    from gradpress.torch import broadcast
    on_device = [torch.nn.Parameter(torch.zeros(2, device="meta"))]
    local = SimpleNamespace(param_groups=[{"params": on_device, "lr": 0.1},
                                          {"params": [torch.zeros(2)], "lr": torch.zeros((), device="meta")},
                                          {"params": [], "lr": 0.1}, {"params": on_device, "lr": 0.1}])
    groups = [{"params": [i], "lr": torch.tensor(0.5), "betas": (0.9, 0.99)} for i in range(4)]
    broadcast._placed(groups, [{"lr": "meta"}, {"lr": "meta"}, {"lr": "meta"}, {"lr": "cpu"}], local)
    assert [g["lr"].device.type for g in groups] == ["meta", "meta", "meta", "cpu"]
    assert groups[0]["betas"] == (0.9, 0.99)
    assert broadcast._devices_of([{"params": [0], "lr": torch.tensor(0.5), "eps": 1e-8}]) == [{"lr": "cpu"}]


def test_overlapping_views_are_broadcast_in_waves_that_never_share_memory(monkeypatch):
    """Two views of one buffer that overlap without being the same tensor: pushed together, one's
    landing could be read by the other's push and the root's values doubled. Each wave is
    waited for before the next starts; tensors apart share a wave."""
    monkeypatch.setattr(ops, "size", lambda: 2)
    monkeypatch.setattr(ops, "rank", lambda: 1)
    log = []
    monkeypatch.setattr(ops, "push_pull_async_inplace", lambda t, average, name: log.append(("push", name)) or name)
    monkeypatch.setattr(ops, "synchronize", lambda handle: log.append(("wait", handle)))
    flat = torch.arange(20.)
    other = torch.zeros(6)
    items = [("a", flat[:10]), ("b", flat[5:15]), ("c", flat[15:]), ("d", flat.view(4, 5)[:, 1]),
             ("e", other), ("f", flat.view(4, 5)[:, 2]), ("g", flat[:0])]
    bps.broadcast_parameters(items, root_rank=0)
    # a, c, e, g apart; b overlaps a; d (elements 1, 6, 11, 16) spans a, b and c; f spans d's bytes
    # but not its elements: an interleaved view is taken as its whole extent
    waves = [["a", "c", "e", "g"], ["b"], ["d"], ["f"]]
    want = [step for wave in waves for step in [("push", f"Parameter.{n}") for n in wave]
            + [("wait", f"Parameter.{n}") for n in wave]]
    assert log == want
    assert all(float(t.abs().sum()) == 0 for _, t in items), "a worker that is not the root zeroes what it pushes"


def test_the_optimizer_layout_carries_tensors_numpy_has_no_dtype_for():
    """A bfloat16 learning rate in ``param_groups`` (numpy has no bfloat16): its bytes travel
    named by torch, and come back equal, as the other tensors and values do."""
    from gradpress.torch.broadcast import _pack, _unpack
    layout = {"lr": torch.tensor(1e-3, dtype=torch.bfloat16), "betas": (torch.tensor(0.9), 0.999),
              "empty": torch.zeros(0, 3, dtype=torch.bfloat16), "f8": torch.ones(2, dtype=torch.float8_e4m3fn),
              "ints": torch.arange(4), "steps": 7}
    back = _unpack(_pack(layout))
    for key in ("lr", "empty", "ints"):
        assert back[key].dtype == layout[key].dtype and torch.equal(back[key], layout[key]), key
    assert back["f8"].dtype == torch.float8_e4m3fn and torch.equal(back["f8"].float(), layout["f8"].float())
    assert isinstance(back["betas"], tuple) and torch.equal(back["betas"][0], torch.tensor(0.9)) and back["steps"] == 7
