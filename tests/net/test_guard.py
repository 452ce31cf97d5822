"""PeerGuard (a budget per peer, drops logged once) and Outbox (sends that never block),
on real ZeroMQ sockets in this process; limits derived from the partition size."""
import logging
import time

import pytest
import zmq

from gradpress.net.guard import PeerGuard
from gradpress.net.limits import Limits, check_lr
from gradpress.net.outbox import Outbox
from gradpress.net.protocol import Op, decode


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_peer_over_its_budget_is_cut_off_and_named_once(caplog):
    clock = Clock()
    guard = PeerGuard("scheduler", rate_per_s=10, burst=5, clock=clock)
    assert all(guard.charge(b"a", "worker 0") for _ in range(5))
    clock.now += 0.15  # one token back (and a half)
    assert guard.charge(b"a", "worker 0") and not guard.charge(b"a", "worker 0")
    assert guard.is_cut(b"a") and not guard.is_cut(b"b") and guard.charge(b"b")
    with caplog.at_level(logging.WARNING):
        for _ in range(1000):
            assert not guard.charge(b"a")  # counted, not logged
    cut_lines = [r.getMessage() for r in caplog.records if "cut off" in r.getMessage()]
    assert len(cut_lines) == 1 and "worker 0" in cut_lines[0], cut_lines
    assert guard.total_dropped == 1000


def test_drops_are_logged_once_per_peer_then_summed_up(caplog):
    clock = Clock()
    guard = PeerGuard("server", rate_per_s=1, burst=1, clock=clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(500):
            guard.dropped(b"x" * 10_000, "dropped a malformed message: not msgpack", "worker 3")
        guard.report()  # too early: nothing yet
        clock.now += 11
        guard.report()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "dropped a malformed message" in lines[0] and "worker 3" in lines[0]
    assert "dropped 499 more message(s)" in lines[1]
    assert max(len(line) for line in lines) < 400  # a 10 kB identity is not copied into the log


def _pair(rcvhwm: int | None = None):
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.SNDHWM, 100)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"peer")
    dealer.setsockopt(zmq.LINGER, 0)
    if rcvhwm:
        dealer.setsockopt(zmq.RCVHWM, rcvhwm)
        dealer.setsockopt(zmq.RCVBUF, 4096)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    dealer.send(b"hello")  # the router learns the peer
    assert router.poll(5000)
    router.recv_multipart()
    return ctx, router, dealer


def test_outbox_never_blocks_on_a_peer_that_never_reads_and_cuts_it_off():
    ctx, router, dealer = _pair(rcvhwm=1)
    clock = Clock()
    guard = PeerGuard("server", rate_per_s=1000, burst=1000, clock=clock)
    outbox = Outbox(router, guard, stall_s=2.0, clock=clock)
    try:
        started = time.monotonic()
        for _ in range(3000):  # 30 MB: far more than the queues and socket buffers hold
            outbox.send(b"peer", Op.ERROR, "server 0", [b"\0" * 10_000], message="x")
        assert time.monotonic() - started < 10
        for _ in range(50):  # let libzmq move what it can: then nothing moves any more
            outbox.flush()
            time.sleep(0.01)
        assert outbox.pending and not guard.is_cut(b"peer")
        clock.now += 3  # nothing read for longer than stall_s
        outbox.flush()
        assert guard.is_cut(b"peer") and not outbox.pending
        outbox.send(b"peer", Op.ERROR, "server 0", message="dropped at once")
        assert not outbox.pending
    finally:
        ctx.destroy(linger=0)


def test_outbox_delivers_everything_in_order_to_a_slow_reader():
    ctx, router, dealer = _pair(rcvhwm=10)
    guard = PeerGuard("server", rate_per_s=1000, burst=1000)
    outbox = Outbox(router, guard, stall_s=30.0)
    try:
        n = 2000
        for i in range(n):
            outbox.send(b"peer", Op.PUSH_ACK, "server 0", [b"\0" * 20_000], key=i, round=0)
        got = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            outbox.flush()
            while dealer.poll(0):
                got.append(decode(dealer.recv_multipart()[0])["key"])
            time.sleep(0.001)
        assert got == list(range(n)), f"{len(got)} of {n} arrived"
        assert not guard.is_cut(b"peer") and not outbox.pending
    finally:
        ctx.destroy(linger=0)


def test_limits_follow_the_partition_size():
    lim = Limits(4096000)
    assert lim.max_count("float32") == 1024000 and lim.max_count("float16") == 2048000
    lim.check_count(1024000, "float32", "key 1")
    with pytest.raises(ValueError, match="BYTEPS_PARTITION_BYTES=4096000"):
        lim.check_count(1 << 62, "float32", "key 1")
    assert lim.scheduler_frame_bytes < 2 << 20 < 8 << 30
    assert Limits(256 << 20).data_frame_bytes == 2 * (256 << 20)  # a float16 key's float32 residual
    with pytest.raises(ValueError, match="finite"):
        check_lr(float("nan"), "key 1")
    check_lr(0.0, "key 1")
