"""A server's lanes (net/transport.lanes_router): one endpoint per I/O thread, the workers
spread over them by rank."""
import socket

import pytest
import zmq

from gradpress.config import Settings
from gradpress.net import transport
from gradpress.net.node import NodeInfo

from cluster import TEST_SECRET


def settings(**kw):
    return Settings(role="server", node_host="127.0.0.1", job_secret=TEST_SECRET, **kw)


def test_the_default_is_one_lane_per_io_thread_with_curve_and_one_without():
    assert transport.server_lanes(settings(io_threads=3)) == 3
    assert transport.server_lanes(settings(io_threads=3, security="auth")) == 1
    assert transport.server_lanes(settings(io_threads=3, security="auth", server_lanes=2)) == 2
    # never more lanes than the process has I/O threads (the default count may be the smaller)
    assert transport.server_lanes(settings(server_lanes=16, security="auth")) == transport.IO_THREADS


@pytest.mark.parametrize("kw,why", [({"server_lanes": 0}, "GRADPRESS_SERVER_LANES=0"),
                                    ({"server_lanes": 17}, "GRADPRESS_SERVER_LANES=17"),
                                    ({"server_lanes": 4, "io_threads": 2}, "more than GRADPRESS_IO_THREADS=2")])
def test_impossible_lane_counts_are_refused_naming_the_setting(kw, why):
    with pytest.raises(ValueError, match=why):
        settings(**kw)


def _free_run(n: int) -> int:
    """The first of ``n`` consecutive ports free now (a test's best effort)."""
    for start in range(42000, 60000, 97):
        try:
            socks = []
            for p in range(start, start + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return start
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.skip("no run of free ports")


def test_lanes_listen_on_random_ports_or_on_the_fixed_port_and_the_ones_after_it():
    ctx = zmq.Context(io_threads=3)
    try:
        sock, ports = transport.lanes_router(ctx, settings(io_threads=3), 0, 3)
        assert len(set(ports)) == 3
        sock.close(linger=0)
        start = _free_run(3)
        sock, ports = transport.lanes_router(ctx, settings(io_threads=3), start, 3)
        assert ports == [start, start + 1, start + 2]
        sock.close(linger=0)
        # a lane's port taken: the error names the port, the lane and the setting
        start = _free_run(2)
        taken = socket.socket()
        try:
            taken.bind(("127.0.0.1", start + 1))
            taken.listen()
            with pytest.raises(OSError, match=rf":{start + 1} \(lane 1 of 2: GRADPRESS_SERVER_LANES\)"):
                transport.lanes_router(ctx, settings(io_threads=3), start, 2)
        finally:
            taken.close()
    finally:
        ctx.term()  # (every socket closed; not destroy: the ZAP handler's thread closes its own)


def test_no_more_lanes_than_the_context_has_io_threads():
    ctx = zmq.Context(io_threads=1)  # (a context made before the settings asked for more)
    try:
        sock, ports = transport.lanes_router(ctx, settings(io_threads=3), 0, 3)
        assert len(ports) == 1
        sock.close(linger=0)
    finally:
        ctx.term()


def test_workers_take_a_servers_lanes_in_turn_by_rank():
    server = NodeInfo("server", 0, "h", 9100, "", (9100, 9101, 9102))
    assert [server.port_for(r) for r in range(5)] == [9100, 9101, 9102, 9100, 9101]
    assert NodeInfo("server", 0, "h", 9100).port_for(3) == 9100   # one port: every worker there


def _cpu_ns(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/schedstat") as fh:
        return int(fh.read().split()[0])


def _name(tid: int) -> str:
    with open(f"/proc/self/task/{tid}/comm") as fh:
        return fh.read().strip()


def _threads() -> set[int]:
    import os
    return {int(t) for t in os.listdir("/proc/self/task")}


def test_each_lane_decrypts_its_connections_on_its_own_io_thread():
    """Three CURVE clients connect at once to lane 0 and one to lane 1 of a server with two
    I/O threads: lane 0's thread decrypts three quarters of the bytes, lane 1's one quarter.
    (Without lanes, libzmq's least-loaded choice puts them wherever its stale counts say.)"""
    before = _threads()
    server_ctx = zmq.Context(io_threads=2)
    sock, ports = transport.lanes_router(server_ctx, settings(io_threads=2), 0, 2)
    # the server context's two I/O threads by their index (the affinity bit), lane order (a
    # thread names itself once it runs)
    import time
    deadline = time.monotonic() + 10
    while len(io := sorted((t for t in _threads() - before if _name(t).startswith("ZMQbg/IO/")), key=_name)) < 2:
        assert time.monotonic() < deadline, "the server context's I/O threads never started"
        time.sleep(0.01)
    clients, dealers = [], []
    try:
        for i, lane in enumerate((0, 0, 0, 1)):
            ctx = zmq.Context(io_threads=1)
            clients.append(ctx)
            dealers.append(transport.dealer(ctx, Settings(role="worker", job_secret=TEST_SECRET), "127.0.0.1",
                                            ports[lane], f"c{i}".encode()))
        start = [_cpu_ns(t) for t in io]
        payload = bytes(4 << 20)
        for _ in range(12):
            for d in dealers:
                d.send(payload, copy=False)
        for _ in range(12 * 4):
            assert sock.poll(30_000), "a push never arrived"
            sock.recv_multipart(copy=False)
        used = [_cpu_ns(t) - s for t, s in zip(io, start)]
        share = used[0] / sum(used)
        assert 0.6 < share < 0.9, used
    finally:
        sock.close(linger=0)
        for d in dealers:
            d.close(linger=0)
        for ctx in clients:
            ctx.term()
        server_ctx.term()  # (not destroy: its ZAP handler's thread closes its own socket)


def test_a_port_another_process_holds_is_named_as_taken_not_as_a_wrong_address():
    """(The error said DMLC_NODE_HOST must be an address of this machine: it was.)"""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    ctx = zmq.Context()
    try:
        with pytest.raises(OSError, match=rf"port {port} is taken by another process.*GRADPRESS_SERVER_PORT"):
            transport.lanes_router(ctx, settings(security="auth"), port, 1)
        with pytest.raises(OSError, match="DMLC_NODE_HOST='10.255.255.1' must be an address of this machine"):
            transport.lanes_router(ctx, Settings(role="server", node_host="10.255.255.1", job_secret=TEST_SECRET,
                                                 security="auth"), 0, 1)
    finally:
        holder.close()
        ctx.term()
