"""``handles.wait``: what a push_pull that failed leaves to undo runs once it is over (the
consumer's stream waits for the worker's GPU work, a staging buffer is given back), and not
where only the wait ran out while the push_pull may still write into its tensors."""
import pytest
import torch

from gradpress.errors import JobError, OpTimeoutError
from gradpress.torch import handles
from gradpress.worker.future import Future


def start(future: Future) -> tuple[int, list]:
    undone = []
    pending = handles.Pending(future, torch.zeros(3), lambda: undone.append("finish"), lambda: undone.append("abandon"))
    return handles.register(pending), undone


def test_a_failed_push_pull_is_abandoned_and_its_error_raised():
    future = Future("a push_pull")
    handle, undone = start(future)
    future.fail(JobError("a server died"))
    with pytest.raises(JobError, match="a server died"):
        handles.wait(handle, 1.0)
    assert undone == ["abandon"]
    with pytest.raises(ValueError, match="unknown push_pull handle"):
        handles.lookup(handle)


def test_a_wait_that_runs_out_leaves_the_push_pull_its_tensors():
    handle, undone = start(Future("a push_pull"))
    with pytest.raises(OpTimeoutError):
        handles.wait(handle, 0.01)
    assert undone == []


def test_a_finished_push_pull_lands_and_is_not_abandoned():
    future = Future("a push_pull")
    handle, undone = start(future)
    future.set(None)
    assert torch.equal(handles.wait(handle, 1.0), torch.zeros(3))
    assert undone == ["finish"]
