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
