"""A misbehaving member cannot stop a job: bad messages, a peer that never reads, a flood,
a frame that claims 8 GiB. Each attack comes from this test process, over real sockets
(with the job's secret, as a member's would), at a real job of separate processes."""
import json
import socket
import struct
import time

import pytest
import zmq

from gradpress.config import Settings
from gradpress.net import protocol, transport
from gradpress.net.protocol import Op

pytestmark = pytest.mark.integ

# Every worker: one round to create the key, then rounds until the attack is over, then five
# more; every sum is checked exactly (onebit of a constant tensor is exact).
TRAIN_THROUGH_ATTACK = """
import json, os, time, torch, gradpress.torch as bps
from gradpress.torch import ops
bps.init()
r, n = bps.rank(), bps.size()
d = os.environ["GP_TEST_DIR"]
N = 20000
cp = {"compressor": "onebit", "scaling": True}
def step(value, want):
    got = bps.push_pull(torch.full((N,), float(value)), average=False, name="w", compression_params=cp)
    assert torch.all(got == want), (value, got[:3], want)
step(r + 1, n * (n + 1) / 2)
if r == 0:
    client = ops._require()
    wk = client.tensor("w").keys[0]
    server = client.book.servers[wk.server]
    with open(os.path.join(d, "target.json.tmp"), "w") as fh:
        json.dump({"host": server.host, "port": server.port, "key": wk.key, "count": wk.count}, fh)
    os.replace(os.path.join(d, "target.json.tmp"), os.path.join(d, "target.json"))
steps = 0
def go_seen():
    if not os.environ.get("GP_KEEP_STEPPING"):
        return os.path.exists(os.path.join(d, "go"))
    # stepping meanwhile, the workers must stop after the same step: they agree on the flag
    flag = torch.tensor([1.0 if os.path.exists(os.path.join(d, "go")) else 0.0])
    return bps.push_pull(flag, average=False, name="go").item() > 0
while not go_seen():
    if os.environ.get("GP_KEEP_STEPPING"):
        step(r + 1, n * (n + 1) / 2)
        steps += 1
    time.sleep(0.02)
for rnd in range(5):
    step(rnd + r + 1, n * (rnd + 1) + n * (n - 1) / 2)
print(f"OK sums right through the attack ({steps} steps during it)", flush=True)
bps.shutdown()
"""


def _wait_for(path, c, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared\n{c.logs()}"
        time.sleep(0.05)


def _member(ctx, c, host, port, rcvhwm=None):
    """A DEALER with the job's secret, as a member's; ``rcvhwm``: a tiny receive queue."""
    settings = Settings(job_secret=c.secret) if "GRADPRESS_INSECURE" not in c.job.env else Settings(insecure=True)
    sock = transport.job_socket(ctx, zmq.DEALER, settings, binds=False)
    sock.setsockopt(zmq.LINGER, 0)
    if rcvhwm is not None:
        sock.setsockopt(zmq.RCVHWM, rcvhwm)
        sock.setsockopt(zmq.RCVBUF, 4096)
    sock.connect(f"tcp://{host}:{port}")
    return sock


def _header(op, **fields):
    return protocol.encode(op, "worker 9", **fields)


def _reply(sock, timeout_s=10):
    assert sock.poll(timeout_s * 1000), "no reply"
    frames = sock.recv_multipart()
    return protocol.decode(frames[0])


def _send_many(sock, frames, n, deadline_s):
    """Send ``n`` copies without ever blocking this test (a stuck receiver is a failure, not a hang)."""
    deadline = time.monotonic() + deadline_s
    sent = 0
    while sent < n:
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
            sent += 1
        except zmq.Again:
            assert time.monotonic() < deadline, f"the receiver stopped taking messages after {sent} of {n}"
            time.sleep(0.001)
    return sent


def test_a_huge_init_key_a_bad_future_push_and_a_peer_that_never_reads_leave_the_job_exact(cluster):
    c = cluster(workers=2, servers=1, env={"GRADPRESS_OP_TIMEOUT_S": "20", "BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start(TRAIN_THROUGH_ATTACK)
    _wait_for(c.tmp / "target.json", c)
    target = json.loads((c.tmp / "target.json").read_text())
    ctx = zmq.Context()
    try:
        srv = _member(ctx, c, target["host"], target["port"])
        # one INIT_KEY claiming 2^62 elements: refused with an ERROR, nothing allocated
        srv.send(_header(Op.INIT_KEY, key=(1 << 40), name="huge", count=1 << 62, dtype="float32"))
        h = _reply(srv)
        assert h["op"] == Op.ERROR and "exceed one partition" in h["message"], h
        # a malformed onebit push for round 2 (the key is at round 1): refused on arrival
        meta = {"codec": "onebit", "n": target["count"]}
        srv.send_multipart([_header(Op.PUSH, key=target["key"], round=2, dtype="float32", count=target["count"],
                                    codec="onebit", meta=meta), b"\0\0\x80?", b"\1\2\3"])
        h = _reply(srv)
        assert h["op"] == Op.ERROR and h["round"] == 2 and "malformed onebit payload" in h["message"], h
        srv.close()
        # a peer that never reads: tens of thousands of requests that each get a reply
        lazy_sched = _member(ctx, c, "127.0.0.1", c.port, rcvhwm=1)
        lazy_srv = _member(ctx, c, target["host"], target["port"], rcvhwm=1)
        register = _header(Op.REGISTER, role="worker", host="h", port=1, worker_id=0, local_rank=0,
                           local_size=1, pid=1)
        _send_many(lazy_sched, [register], 40_000, deadline_s=60)
        _send_many(lazy_srv, [_header(Op.PULL, key=(1 << 40) + 1, round=0)], 40_000, deadline_s=60)
        # past PS_HEARTBEAT_TIMEOUT (5 s) still stuck, the peer is cut off: wait for it to be
        # said (a loaded machine takes a while to answer 40,000 requests), within a deadline
        deadline = time.monotonic() + 60
        while not all("cut off peer" in c.log(role) for role in ("scheduler", "server 0")):
            assert time.monotonic() < deadline, f"no peer was cut off within 60 s\n{c.logs()}"
            time.sleep(0.2)
        (c.tmp / "go").touch()
        c.assert_success(90)
    finally:
        ctx.destroy(linger=0)
    assert "OK sums right through the attack" in c.log("worker 0") and "OK" in c.log("worker 1"), c.logs()
    for role in ("scheduler", "server 0"):
        assert "cut off peer" in c.log(role) and "has not read its messages" in c.log(role), c.log(role)


def test_a_heartbeat_flood_is_cut_off_and_the_job_goes_on(cluster):
    c = cluster(workers=2, servers=1, env={"PS_HEARTBEAT_TIMEOUT": "3", "GRADPRESS_PEER_RATE": "2000",
                                           "GRADPRESS_PEER_BURST": "20000", "BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start(TRAIN_THROUGH_ATTACK, worker_env={"GP_KEEP_STEPPING": "1"})
    _wait_for(c.tmp / "target.json", c)
    ctx = zmq.Context()
    try:
        flood = _member(ctx, c, "127.0.0.1", c.port)
        heartbeat = [_header(Op.HEARTBEAT)]
        sent, started = 0, time.monotonic()
        while time.monotonic() - started < 4.5:  # longer than PS_HEARTBEAT_TIMEOUT
            try:
                for _ in range(500):
                    flood.send_multipart(heartbeat, zmq.NOBLOCK)
                    sent += 1
            except zmq.Again:
                time.sleep(0.0005)
        rate = sent / (time.monotonic() - started)
        (c.tmp / "go").touch()
        c.assert_success(60)
    finally:
        ctx.destroy(linger=0)
    assert "OK sums right through the attack" in c.log("worker 0"), c.logs()
    assert "cut off peer" in c.log("scheduler") and "per second" in c.log("scheduler"), c.log("scheduler")
    assert sent > 20_000, f"the flood sent only {sent} heartbeats ({rate:.0f}/s)"
    # the log says how much was dropped in a few lines, not one line per message
    assert c.log("scheduler").count("\n") < 200, c.log("scheduler")[-3000:]


def _rss_bytes(pid):
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _claim_8_gib(host, port, send_bytes):
    """Speak ZMTP 3.0 (NULL mechanism) by hand and send a frame header claiming 8 GiB, then
    up to ``send_bytes`` of it. Returns how many bytes of it the peer took before it hung up."""
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31
    props = bytes([11]) + b"Socket-Type" + struct.pack(">I", 6) + b"DEALER"
    ready = b"\x05READY" + props
    taken = 0
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(greeting + bytes([0x04, len(ready)]) + ready)
        s.sendall(bytes([0x02]) + struct.pack(">Q", 8 << 30))  # a long message frame of 8 GiB
        chunk = b"\0" * (1 << 20)
        try:
            while taken < send_bytes:
                taken += s.send(chunk)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass
    return taken


def test_a_frame_claiming_8_gib_is_refused_at_the_size_limit(cluster):
    # raw ZMTP needs the NULL mechanism: this job runs without a secret (the limit is the same)
    c = cluster(workers=1, servers=1, env={"GRADPRESS_INSECURE": "1", "BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start(TRAIN_THROUGH_ATTACK, worker_env={"GP_KEEP_STEPPING": "1"})
    _wait_for(c.tmp / "target.json", c)
    target = json.loads((c.tmp / "target.json").read_text())
    for name, host, port in (("scheduler", "127.0.0.1", c.port), ("server 0", target["host"], target["port"])):
        pid = c.procs[name].pid
        before = _rss_bytes(pid)
        taken = _claim_8_gib(host, port, send_bytes=256 << 20)
        grown = _rss_bytes(pid) - before
        assert taken < 128 << 20, f"{name} took {taken >> 20} MiB of a frame claiming 8 GiB"
        assert grown < 32 << 20, f"{name} grew by {grown >> 20} MiB after a frame claiming 8 GiB"
    (c.tmp / "go").touch()
    c.assert_success(60)
    assert "OK sums right through the attack" in c.log("worker 0"), c.logs()


def test_a_register_with_impossible_numbers_is_refused_naming_them(cluster):
    c = cluster(workers=1, servers=1)
    c.start_scheduler()
    ctx = zmq.Context()
    try:
        peer = _member(ctx, c, "127.0.0.1", c.port)
        for fields, why in (({"local_size": 0}, "BYTEPS_LOCAL_SIZE=0"), ({"local_rank": 3}, "BYTEPS_LOCAL_RANK=3"),
                            ({"port": 70000}, "port 70000"), ({"machine": "m" * 4096}, "machine id of 4096")):
            peer.send(_header(Op.REGISTER, **{**dict(role="worker", host="h", port=1, worker_id=0, local_rank=0,
                                                     local_size=1, pid=1), **fields}))
            h = _reply(peer)
            assert h["op"] == Op.ERROR and why in h["message"], h
        # a server's lanes: its port first, distinct port numbers, at most 16; a worker has none
        for role, ports in (("server", [2, 1]), ("server", [1, 1]), ("server", [1, 70000]),
                            ("server", list(range(1, 18))), ("worker", [1, 2])):
            peer.send(_header(Op.REGISTER, role=role, host="h", port=1, worker_id=0 if role == "worker" else -1,
                              local_rank=0, local_size=1, pid=1, ports=ports))
            h = _reply(peer)
            assert h["op"] == Op.ERROR and f"ports {ports!r}" in h["message"], h
    finally:
        ctx.destroy(linger=0)
        c.kill()

