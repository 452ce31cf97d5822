"""``handles.wait``: what a push_pull that failed leaves to undo runs once it is over (the
consumer's stream waits for the worker's GPU work, a staging buffer is given back), and not
where only the wait ran out while the push_pull may still write into its tensors."""
import contextlib

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


def test_every_handle_of_a_group_is_waited_for_past_a_failed_one():
    """``wait_all`` (a broadcast's handles, a reducer's): after one fails, the later ones are
    still waited for, so none stays pending and each failed one is abandoned; the first
    failure is raised."""
    futures = [Future(f"push_pull {i}") for i in range(4)]
    started = [start(f) for f in futures]
    futures[0].set(None)
    futures[1].fail(JobError("tensor 't1': a mismatch"))
    futures[2].set(None)
    futures[3].fail(JobError("tensor 't3': a server died"))
    with pytest.raises(JobError, match="'t1': a mismatch"):
        handles.wait_all([h for h, _ in started], lambda h: handles.wait(h, 1.0))
    assert [undone for _, undone in started] == [["finish"], ["abandon"], ["finish"], ["abandon"]]
    assert not any(h in handles._handles for h, _ in started)


def test_handles_started_before_a_refused_start_are_waited_for_and_the_refusal_stands():
    futures = [Future(f"push_pull {i}") for i in range(2)]
    started = [start(f) for f in futures]
    futures[0].set(None)
    futures[1].fail(JobError("the job ended"))
    with pytest.raises(ValueError, match="a bad dtype"):
        with handles.all_waited(lambda h: handles.wait(h, 1.0)) as group:
            group += [h for h, _ in started]
            raise ValueError("a bad dtype")
    assert [undone for _, undone in started] == [["finish"], ["abandon"]]
    assert not any(h in handles._handles for h, _ in started)
    future = Future("push_pull")
    handle, undone = start(future)
    future.set(None)
    with handles.all_waited(lambda h: handles.wait(h, 1.0)) as group:
        group.append(handle)
        assert undone == []   # waited for when the block ends
    assert undone == ["finish"]


def test_settle_waits_for_every_push_pull_to_end_and_leaves_the_handles_to_synchronize():
    import threading
    import time
    done, failed, stuck = Future("a"), Future("b"), Future("c")
    handles_ = [start(f)[0] for f in (done, failed, stuck)]
    threading.Timer(0.2, done.set).start()
    threading.Timer(0.2, failed.fail, (JobError("a server died"),)).start()
    began = time.monotonic()
    handles.settle(1.0)   # the stuck one is waited for until the deadline, in all
    assert done.done() and failed.done()
    assert 0.9 < time.monotonic() - began < 3
    for handle in handles_:
        handles.lookup(handle)  # still there for synchronize
    stuck.set(None)
    for handle in handles_:
        with pytest.raises(JobError) if handle == handles_[1] else contextlib.nullcontext():
            handles.wait(handle, 1.0)


def test_a_handle_synchronized_twice_gives_none_as_in_byteps_and_one_never_issued_raises():
    future = Future("a push_pull")
    handle, _ = start(future)
    future.set(None)
    assert torch.equal(handles.wait(handle, 1.0), torch.zeros(3))
    assert handles.wait(handle, 1.0) is None
    with pytest.raises(ValueError, match="unknown push_pull handle"):
        handles.wait(handle + 10**6, 1.0)


def test_a_wait_that_raised_raises_again_on_a_second_wait():
    future = Future("a push_pull")
    handle, _ = start(future)
    with pytest.raises(OpTimeoutError):
        handles.wait(handle, 0.01)
    with pytest.raises(OpTimeoutError):   # not None: the push_pull may still write into its tensor
        handles.wait(handle, 0.01)
    failed, _ = start(Future("another"))
    handles._handles[failed].future.fail(JobError("a server died"))
    for _ in range(2):
        with pytest.raises(JobError, match="a server died"):
            handles.wait(failed, 1.0)
