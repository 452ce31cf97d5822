"""Copies off the GPU waited for off the communication thread (``worker/host_copies.py``):
what follows a copy runs on the thread that calls ``run_finished``, in the order the copies
were queued, and only once each copy's event has happened; a partition's push and pull go
out only then, over a real ZeroMQ socket, and not at all for a round failed meanwhile; and a
compress of a CUDA chunk, run on the same thread in the same queue (``run``)."""
import collections
import contextlib
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import zmq

from gradpress.kernels.cuda import device
from gradpress.net import transport
from gradpress.net.protocol import Op
from gradpress.trace import Tracer
from gradpress.worker.future import Future
from gradpress.worker.host_copies import HostCopies
from gradpress.worker.jobs import PartitionOp, PushPull
from gradpress.worker.keys import KeyTable, Tensor
from gradpress.worker.stages import PartitionStages


class Copy:
    """A copy's event: ``synchronize`` blocks until the test finishes the copy."""

    def __init__(self, fails: bool = False):
        self.done, self.fails = threading.Event(), fails

    def query(self):
        return self.done.is_set() and not self.fails

    def synchronize(self):
        assert self.done.wait(30), "the test never finished this copy"
        if self.fails:
            raise OSError("an illegal memory access was encountered")


class Wakes:
    """The communication thread's pipe: counts the wakes, and lets the test wait for them."""

    def __init__(self):
        self.n, self.cond = 0, threading.Condition()

    def __call__(self):
        with self.cond:
            self.n += 1
            self.cond.notify_all()

    def wait_for(self, n: int, seconds: float = 10) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.n >= n, seconds)


def test_each_copys_turn_runs_on_the_caller_in_queued_order_once_its_event_happened():
    wakes, ran = Wakes(), []
    copies = HostCopies(wakes)
    first, second = Copy(), Copy()
    copies.after(first, lambda: ran.append(("first", threading.get_ident())))
    copies.after(second, lambda: ran.append(("second", threading.get_ident())))
    second.done.set()  # finished first on its own: still waits behind the first copy
    assert not wakes.wait_for(1, 0.3), "woken before the first copy was done"
    copies.run_finished()
    assert ran == [] and wakes.n == 0
    first.done.set()
    assert wakes.wait_for(2)
    copies.run_finished()
    assert ran == [("first", threading.get_ident()), ("second", threading.get_ident())]
    assert copies.close(5)


def test_a_copy_done_when_queued_is_followed_at_once_without_the_thread():
    wakes, ran = Wakes(), []
    copies = HostCopies(wakes)
    done = Copy()
    done.done.set()
    copies.after(done, lambda: ran.append(threading.get_ident()))
    assert ran == [threading.get_ident()] and wakes.n == 0 and copies._thread is None


def test_a_failed_copy_raises_on_the_caller_naming_the_partition_and_later_copies_still_come():
    wakes, ran = Wakes(), []
    copies = HostCopies(wakes)
    bad, good = Copy(fails=True), Copy()
    copies.after(bad, lambda: ran.append("bad"), what=lambda: "tensor 'w': partition 2 (key 7)")
    copies.after(good, lambda: ran.append("good"))
    bad.done.set()
    good.done.set()
    assert wakes.wait_for(2)
    with pytest.raises(RuntimeError, match=r"copy from the GPU to the host failed \(tensor 'w': partition 2 "
                                           r"\(key 7\)\): .*illegal memory access"):
        copies.run_finished()
    copies.run_finished()
    assert ran == ["good"]
    assert copies.close(5)


def test_a_copys_event_is_handed_back_once_waited_for_and_never_when_the_copy_failed():
    """(``waited``: a torch event goes back to its device's pool, ``device.copied``.)"""
    wakes, back = Wakes(), []
    copies = HostCopies(wakes)
    at_once, later, bad = Copy(), Copy(), Copy(fails=True)
    at_once.done.set()
    copies.after(at_once, lambda: back.append("then"), lambda: back.append("at once"))
    assert back == ["at once", "then"]
    copies.after(later, lambda: None, lambda: back.append("later"))
    copies.after(bad, lambda: None, lambda: back.append("bad"))
    assert not wakes.wait_for(1, 0.2) and back == ["at once", "then"], "handed back before it happened"
    later.done.set()
    bad.done.set()
    assert wakes.wait_for(2) and back == ["at once", "then", "later"]
    assert copies.close(5)


def test_torchs_copy_events_are_reused_by_device_and_kept_apart_from_nonblocking_ones(monkeypatch):
    from gradpress.kernels.cuda import streams
    made = []

    class Event:
        def __init__(self, blocking=False):
            self.blocking = blocking
            made.append(self)
    monkeypatch.setattr(streams, "_torch", lambda: SimpleNamespace(cuda=SimpleNamespace(Event=Event)))
    monkeypatch.setattr(streams, "_events", collections.defaultdict(collections.deque))
    chunk = SimpleNamespace(cpu=None, numpy=None, device=SimpleNamespace(index=1))   # a CUDA tensor's stand-in
    first = streams.event(1, blocking=True)
    assert first.blocking
    device.copied(first, chunk)                # waited for: back in device 1's blocking pool
    assert streams.event(1, blocking=True) is first
    assert not streams.event(1).blocking       # a stream's ordering event is not one of them
    device.copied(first, chunk)
    assert streams.event(0, blocking=True) is not first, "an event belongs to the device it was recorded on"
    device.copied(Copy(), np.zeros(3))         # numba's (a device array's) are not pooled
    assert len(made) == 3


def test_work_runs_on_the_thread_behind_earlier_copies_and_its_result_or_error_comes_back_to_the_caller():
    wakes, ran = Wakes(), []
    copies = HostCopies(wakes)
    copy = Copy()
    copies.after(copy, lambda: ran.append("copied"))
    copies.run(lambda: threading.current_thread().name, lambda name: ran.append(("encoded on", name)))

    def refuse():
        raise ValueError("the input holds NaN")
    copies.run(refuse, lambda _: ran.append("never"))
    assert not wakes.wait_for(1, 0.3), "work ran before the copy queued ahead of it was done"
    copy.done.set()
    assert wakes.wait_for(3)
    with pytest.raises(ValueError, match="the input holds NaN"):  # its own error, not a copy's
        copies.run_finished()
    assert ran == ["copied", ("encoded on", "gp-host-copies")]
    assert copies.close(5)


def test_closing_drops_what_is_still_queued_and_waits_for_the_work_running():
    """At the worker's end nothing queued starts any more (an encoder would launch after the
    streams were drained), the work running ends first, and a thread stuck in its copy is
    left at the deadline."""
    wakes, ran = Wakes(), []
    copies = HostCopies(wakes)
    started, release = threading.Event(), threading.Event()

    def encoding():
        started.set()
        assert release.wait(10)
        ran.append("encoded")
    copies.run(encoding, lambda _: None)
    copies.run(lambda: ran.append("queued behind it"), lambda _: None)
    assert started.wait(10)
    threading.Timer(0.2, release.set).start()
    assert copies.close(10)
    assert ran == ["encoded"]
    entered = threading.Event()

    class Stuck(Copy):
        def synchronize(self):
            entered.set()
            super().synchronize()
    stuck, copy = HostCopies(wakes), Stuck()
    stuck.after(copy, lambda: None)
    assert entered.wait(10)
    assert not stuck.close(0.1), "it waited past its deadline for a copy that had not ended"
    copy.done.set()


class OnGpu:
    """Stands for a CUDA chunk (``is_device_array``) of known values."""
    __cuda_array_interface__ = {}

    def __init__(self, values):
        self.values = values

    def __getitem__(self, s):
        return OnGpu(self.values[s])


@pytest.fixture
def link():
    ctx = zmq.Context()
    server = ctx.socket(zmq.ROUTER)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    worker = ctx.socket(zmq.DEALER)
    worker.connect(f"tcp://127.0.0.1:{port}")
    yield worker, server
    worker.close(0)
    server.close(0)
    ctx.term()


def test_a_partitions_push_and_pull_wait_for_its_copy_and_a_round_failed_meanwhile_never_goes(link, monkeypatch):
    worker, server = link
    queued = []

    def copy_to_host_queued(chunk, host):
        queued.append(Copy())
        host[:] = chunk.values  # (the copy itself; the event says when the host may read it)
        return queued[-1]
    monkeypatch.setattr(device, "copy_to_host_queued", copy_to_host_queued)
    monkeypatch.setattr(device, "working_on", lambda x, landing=False: contextlib.nullcontext())
    monkeypatch.setattr(device, "pinned_host", lambda n, dtype, near=None: np.zeros(n, dtype))
    wakes = Wakes()
    stages = PartitionStages("worker 0", [worker], [False], Tracer(""), HostCopies(wakes))
    table = KeyTable()
    t = Tensor("g", 8, "float32", 1, [4, 4], [0, 0], None)
    table.add(t, 1)
    values = np.arange(8, dtype=np.float32)
    job = PushPull(t, OnGpu(values), OnGpu(np.zeros(8, np.float32)), 1, Future("test"), 2)
    ops = [PartitionOp(job, wk, round=0) for wk in t.keys]
    for op in ops:
        op.wkey.in_flight = op
        stages.send(op, None)
    assert not server.poll(200), "pushed before its copy was done"
    ops[1].wkey.in_flight = None  # its deadline passed while its copy ran
    for copy in queued:
        copy.done.set()
    assert wakes.wait_for(2)
    stages.host_copies.run_finished()
    got = []
    while server.poll(500):
        _, h, frames = transport.recv(server, routed=True)
        got.append((h["op"], h["key"], h.get("pull"), [np.frombuffer(f.buffer, np.float32).tolist() for f in frames]))
    assert got == [(Op.PUSH, t.keys[0].key, True, [values[:4].tolist()])]
    stages.close()


class StagedStages:
    """The flight's stages, recording: a source staged through pinned host memory (a CUDA
    tensor's asynchronous copy, torch/staging.py) is read only by ``await_source`` and ``send``."""

    def __init__(self, copies):
        self.host_copies, self.pushed, self.waited = copies, [], []

    def introduce(self, wk, src):
        pass

    def await_source(self, job):
        if job.ready is not None:
            job.ready.synchronize()
            self.waited.append(threading.get_ident())
            job.ready = None

    @staticmethod
    def encodes_on_device(op):
        return False

    def compress(self, op):
        return None

    def send(self, op, payload):
        self.pushed.append((op.wkey.index, op.job.src[:2].tolist()))


def test_a_staged_source_still_being_copied_is_waited_for_off_the_communication_thread():
    """The communication thread no longer blocks in the copy's event (it went on landing and
    sending nothing meanwhile): the partitions go once the copy is done, in order, and a
    round failed meanwhile never goes."""
    from dataclasses import replace

    from gradpress.config import Settings
    from gradpress.worker.deadlines import Deadlines
    from gradpress.worker.flight import PartitionFlight
    wakes = Wakes()
    stages = StagedStages(HostCopies(wakes))
    table = KeyTable()
    t = Tensor("g", 12, "float32", 1, [4, 4, 4], [0, 0, 0], None)
    table.add(t, 1)
    flight = PartitionFlight(replace(Settings(), scheduling_credit=64), stages, table, Deadlines())
    copy = Copy()
    src = np.zeros(12, np.float32)
    job = PushPull(t, src, src, 1, Future("test"), 3, ready=copy)
    flight.start(job, 0)
    flight.dispatch()   # returns: the copy is not done
    assert stages.pushed == [] and stages.waited == []
    assert [wk.in_flight is not None for wk in t.keys] == [True] * 3, "each key's round is taken meanwhile"
    t.keys[2].in_flight = None   # its deadline passed while the copy ran
    src[:] = 7.0                 # (what the copy writes)
    copy.done.set()
    assert wakes.wait_for(3)
    stages.host_copies.run_finished()
    assert stages.pushed == [(0, [7.0, 7.0]), (1, [7.0, 7.0])]
    assert stages.waited == [threading.get_ident()], "one wait, already done, on the communication thread"
    done = Copy()
    done.done.set()
    flight.start(PushPull(t, src, src, 1, Future("test"), 3, ready=done), 0)
    for wk in t.keys:
        wk.in_flight = None
    flight.dispatch()   # a copy done before its turn: no hand-off
    assert len(stages.pushed) == 5 and stages.waited[-1] == threading.get_ident()
    assert stages.host_copies.close(5)
