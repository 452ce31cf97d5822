"""``Future``: set once, by one thread; waited for by any number, each with a deadline."""
import threading
import time

import pytest

from gradpress.errors import OpTimeoutError
from gradpress.worker.future import Future


def test_every_waiter_gets_the_value_set_once_from_another_thread():
    fut, got = Future("push_pull of tensor 'w'"), []
    waiters = [threading.Thread(target=lambda: got.append(fut.result(10))) for _ in range(4)]
    for w in waiters:
        w.start()
    time.sleep(0.05)
    assert not fut.done() and got == []
    fut.set(7)
    fut.set(8)  # a later set changes nothing
    fut.fail(RuntimeError("too late"))
    for w in waiters:
        w.join(10)
    assert fut.done() and got == [7, 7, 7, 7]
    assert fut.result(0) == 7 and fut.result(0) == 7  # and again, at once


def test_a_failure_is_raised_to_every_waiter_and_a_pending_one_times_out_naming_what():
    fut = Future("push_pull of tensor 'f'")
    with pytest.raises(OpTimeoutError, match=r"push_pull of tensor 'f': no result within 0 s"):
        fut.result(0)
    start = time.monotonic()
    with pytest.raises(OpTimeoutError, match="within 0.2 s"):
        fut.result(0.2)
    assert 0.15 < time.monotonic() - start < 5
    fut.fail(ValueError("server 1: bad round"))
    for _ in range(2):
        with pytest.raises(ValueError, match="server 1: bad round"):
            fut.result(1)


def test_setters_racing_leave_one_result_and_no_waiter_stuck_or_raising():
    for _ in range(200):
        fut, errors = Future("race"), []

        def wait():
            try:
                fut.result(10)
            except Exception as e:  # noqa: BLE001 - the test reports any
                errors.append(e)
        threads = [threading.Thread(target=wait) for _ in range(2)] + \
            [threading.Thread(target=fut.set, args=(1,)), threading.Thread(target=fut.set, args=(2,))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert not errors and fut.done() and fut.result(0) in (1, 2)
