"""A communication thread that dies (a lost peer, its own failure) fails every push_pull
still queued for it with its error, the first use of a tensor (queued behind its declaration)
too, and one handed over just as it died: none is left to wait out its deadline."""
from types import SimpleNamespace

import pytest
import zmq

from gradpress.config import Settings
from gradpress.errors import JobError
from gradpress.trace import Tracer
from gradpress.worker import commands as cmd
from gradpress.worker.comm import CommunicationThread
from gradpress.worker.future import Future


def _comm() -> CommunicationThread:
    return CommunicationThread(Settings(), zmq.Context.instance(), Tracer(""))


def _push_pull(name: str) -> cmd.StartPushPull:
    return cmd.StartPushPull(SimpleNamespace(future=Future(f"push_pull of tensor {name!r}")), priority=0)


def _failed_with(future: Future, error: JobError) -> None:
    with pytest.raises(JobError) as caught:
        future.result(0.1)
    assert caught.value is error


def test_queued_push_pulls_and_first_uses_fail_with_the_threads_error():
    comm = _comm()
    started, first = _push_pull("a"), _push_pull("b")
    declare = cmd.Declare("b", 4, "float32", [4], None, Future("declare tensor 'b'"), start=first)
    comm.submit(started)
    comm.submit(declare)
    error = JobError("lost server 0 (127.0.0.1:1234): no heartbeat for 5 s")
    comm._die(error)
    for future in (started.job.future, declare.future, first.job.future):
        _failed_with(future, error)


def test_a_push_pull_handed_over_as_the_thread_died_fails_too():
    comm = _comm()
    error = JobError("worker communication thread failed: a test's")
    put = comm._commands.put

    def dying_meanwhile(command):  # the thread fails between submit's checks and its put
        comm._die(error)
        put(command)
    comm._commands.put = dying_meanwhile
    late = _push_pull("c")
    comm.submit(late)
    _failed_with(late.job.future, error)
