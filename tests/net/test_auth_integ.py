"""Issue 14: only the job's members can talk to it. A real job (scheduler, server, two
workers as processes over ZeroMQ) and three kinds of outsider, each trying what an
outsider did to an unauthenticated job: register before the workers, read an
aggregate, push into a round, abort the job.

- plain: no CURVE at all (what any process on the network could do before);
- wrong secret: CURVE keys derived from another secret (cannot complete the handshake);
- leaked public key: knows the job's public key, but not its secret key (the ZAP
  handler must refuse it).

Every drill runs twice: under ``GRADPRESS_SECURITY=curve`` (the default) and ``auth`` (PLAIN
with a token from the secret, data unencrypted), where the wrong secret presents another
secret's token and the leaked public key is presented as the password.

A member sending the same PULL gets the aggregate, so the outsiders' silence is the
authentication at work and not a wrong key or round. Also: roles started by hand
without a secret refuse to start, GRADPRESS_INSECURE=1 warns, nothing listens on
0.0.0.0, and a long peer identity is cut in the log.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from cluster import LocalCluster
from gradpress.config import Settings
from gradpress.net import auth, transport
from gradpress.net.protocol import Op

pytestmark = pytest.mark.integ
REPO = Path(__file__).resolve().parents[2]
COUNT = 3000
KEY = 1 << 16          # partition 0 of the job's first (only) tensor
SILENCE_S = 0.4        # how long an outsider waits for an answer that must not come

TRAIN = f"""
import json, os, time, torch, gradpress.torch as bps
from gradpress.torch import ops
bps.init()
r, n, d = bps.rank(), bps.size(), os.environ["GP_TEST_DIR"]
assert r == int(os.environ["DMLC_WORKER_ID"]), ("a worker lost its rank", r)
got = bps.push_pull(torch.full(({COUNT},), float(r + 1)), average=False, name="w")
assert torch.all(got == 3), got[:3]
if r == 0:
    with open(os.path.join(d, "servers.json"), "w") as fh:
        json.dump([[s.host, s.port] for s in ops._require().book.servers], fh)
open(os.path.join(d, f"round0-{{r}}"), "w").close()
while not os.path.exists(os.path.join(d, "go")):
    time.sleep(0.05)
got = bps.push_pull(torch.full(({COUNT},), float(r + 1)), average=False, name="w")
assert torch.all(got == 3), ("round 1 sum is not exact", got[:3])
print(f"OK rank {{r}} of {{n}}, sums exact", flush=True)
bps.shutdown()
"""


def _outsiders(secret: str, mode: str) -> dict[str, callable]:
    """Each kind of outsider: a function that readies a fresh DEALER socket."""
    member = auth.JobKeys.from_secret(secret.encode(), mode)
    stranger = auth.JobKeys.from_secret(os.urandom(32).hex().encode(), mode)
    own_public, own_secret = zmq.curve_keypair()

    def plain(sock):
        pass

    def wrong_secret(sock):
        auth.make_client(sock, stranger)

    def leaked_public_key(sock):
        if mode == "auth":  # the public key as the password: the token is not derivable from it
            sock.setsockopt(zmq.PLAIN_USERNAME, auth.PLAIN_USER)
            sock.setsockopt(zmq.PLAIN_PASSWORD, member.public)
            return
        sock.setsockopt(zmq.CURVE_SERVERKEY, member.public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, own_public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, own_secret)

    return {"plain": plain, "wrong secret": wrong_secret, "leaked public key": leaked_public_key}


def _dealer(ctx, ready, host: str, port: int, name: str) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    # a DEALER whose handshakes keep failing has, between attempts, no peer to queue for:
    # its send would wait forever
    sock.setsockopt(zmq.SNDTIMEO, 2000)
    sock.setsockopt(zmq.IDENTITY, f"outsider-{name}".replace(" ", "-").encode())
    ready(sock)
    sock.connect(f"tcp://{host}:{port}")
    return sock


def _outsider_send(sock: zmq.Socket, *args, **fields) -> None:
    """Send as an outsider; a message ZeroMQ cannot even queue (no completed connection) is
    one that did not get through."""
    try:
        transport.send(sock, *args, **fields)
    except zmq.Again:
        pass


def _answers(sock: zmq.Socket, wait_s: float = SILENCE_S, first: bool = False) -> list[dict]:
    """Every header that arrives within ``wait_s`` (the first one alone, at once, where ``first``)."""
    got, deadline = [], time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0 and sock.poll(left * 1000):
        _, header, _ = transport.recv(sock, routed=False)
        got.append(header)
        if first:
            break
    return got


def _wait_for(paths, c: LocalCluster, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"{[p.name for p in paths if not p.exists()]} never appeared\n{c.logs()}"
        assert all(p.poll() in (None, 0) for p in c.procs.values()), f"a process failed\n{c.logs()}"
        time.sleep(0.05)


def _listening(pid: int) -> list[str]:
    """The TCP addresses process ``pid`` listens on, as ``ip:port`` (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                addr, port = fields[1].split(":")
                ip = ".".join(str(b) for b in reversed(bytes.fromhex(addr))) if len(addr) == 8 else addr
                found.append(f"{ip}:{int(port, 16)}")
    return found


@pytest.fixture(scope="module", params=["curve", "auth"])
def attacked(tmp_path_factory, request):
    """A job attacked by every kind of outsider; yields (cluster, what the outsiders received,
    what a member received, the addresses the scheduler and server listened on)."""
    mode = request.param
    c = LocalCluster(tmp_path_factory.mktemp("auth"), workers=2, servers=1,
                     env={"GRADPRESS_SHM": "0", "GRADPRESS_SECURITY": mode})
    ctx = zmq.Context()
    heard: dict[str, list] = {}
    try:
        c.start_scheduler()
        kinds = _outsiders(c.secret, mode)
        socks = {}
        for name, ready in kinds.items():  # (a) register first, claiming worker 0's slot
            socks[name] = _dealer(ctx, ready, "127.0.0.1", c.port, name)
            _outsider_send(socks[name], Op.REGISTER, "worker 0", role="worker", host="127.0.0.1", port=0,
                           worker_id=0, local_rank=0, local_size=1, pid=os.getpid())
        c.start_server(0)
        script = c.tmp / "worker.py"
        script.write_text(TRAIN)
        for i in range(2):
            c.start_worker(i, [sys.executable, str(script)], GP_TEST_DIR=str(c.tmp))
        _wait_for([c.tmp / "round0-0", c.tmp / "round0-1", c.tmp / "servers.json"], c)
        listening = {n: _listening(c.procs[n].pid) for n in ("scheduler", "server 0")}
        (host, port), = json.loads((c.tmp / "servers.json").read_text())
        lanes = sorted(int(a.rsplit(":", 1)[1]) for a in listening["server 0"])  # its port and any lanes
        assert port in lanes, (port, lanes)
        for name, ready in kinds.items():
            heard[f"{name} at the scheduler"] = _answers(socks[name], 0)
            heard[f"{name} at the server"] = []
            for lane in lanes:  # every port the server listens on
                at_server = _dealer(ctx, ready, host, lane, name)
                _outsider_send(at_server, Op.PULL, "worker 0", key=KEY, round=0)           # (b) read
                _outsider_send(at_server, Op.PUSH, "worker 0", [np.full(COUNT, 1e6, np.float32)],
                               key=KEY, round=1, dtype="float32", count=COUNT)             # (c) push
                heard[f"{name} at the server"] += _answers(at_server)
                at_server.close()
            _outsider_send(socks[name], Op.ABORT, "launcher", reason="outsider says stop",
                           worker_id=0, local_rank=0, pid=1)                               # (d) stop
            heard[f"{name} at the scheduler"] += _answers(socks[name], 0)
        member = transport.dealer(ctx, Settings(job_secret=c.secret, security=mode), host, port, b"member-control")
        transport.send(member, Op.PULL, "worker 0", key=KEY, round=0)
        member_got = _answers(member, 10, first=True)
        member.close()
        long_name = b"x" * 250   # a member gone wrong, with a long name and a malformed message
        noisy = transport.dealer(ctx, Settings(job_secret=c.secret, security=mode), host, port, long_name)
        noisy.send(b"\x00not msgpack")
        time.sleep(0.2)
        noisy.close()
        for s in socks.values():
            s.close()
        (c.tmp / "go").touch()
        c.wait(timeout_s=90)
        yield c, heard, member_got, listening
    finally:
        c.kill()
        ctx.destroy(linger=0)  # a socket left with unsent messages must not block the teardown


def test_outsiders_get_no_answer_from_scheduler_or_server(attacked):
    c, heard, member_got, _ = attacked
    assert member_got and member_got[0]["op"] == Op.PULL_REPLY, \
        f"the member's control PULL was not answered ({member_got}): the attack's key or round is wrong\n{c.logs()}"
    assert set(heard) == {f"{k} at {w}" for k in ("plain", "wrong secret", "leaked public key")
                          for w in ("the scheduler", "the server")}
    assert all(got == [] for got in heard.values()), f"an outsider got answers: {heard}"


def test_the_job_ran_as_if_no_outsider_existed(attacked):
    """(a) the real workers got their own ranks, (c) the round the outsiders pushed 1e6 into
    summed exactly, (d) the outsiders' ABORTs stopped nothing: every process exited 0."""
    c, *_ = attacked
    codes = {n: p.returncode for n, p in c.procs.items()}
    assert all(code == 0 for code in codes.values()), f"exit codes {codes}\n{c.logs()}"
    for r in range(2):
        assert f"OK rank {r} of 2, sums exact" in c.log(f"worker {r}"), c.logs()
    assert "outsider says stop" not in c.logs()


def test_the_zap_handler_refuses_the_leaked_key_and_says_so_once(attacked):
    c, *_ = attacked
    for name in ("scheduler", "server 0"):
        log = c.log(name)
        assert "refused a connection from 127.0.0.1" in log, f"{name} did not log the refusal:\n{log}"
        # the outsider retries every 100 ms; the log says so at 1, 2, 4, 8, ... refusals
        assert log.count("refused a connection") <= 12, f"{name} logs every refusal:\n{log}"


def test_nodes_listen_on_their_own_address_only(attacked):
    c, _, _, listening = attacked
    for name, addrs in listening.items():
        assert addrs, f"{name} listens nowhere?"
        assert all(a.startswith("127.0.0.1:") for a in addrs), f"{name} listens on {addrs}, not only 127.0.0.1"
    # with curve a server listens on a lane per I/O thread (2 at least), every one attacked above;
    # with auth, where there is no cipher to spread, on its one port
    lanes = len(listening["server 0"])
    assert lanes >= 2 if c.job.env.get("GRADPRESS_SECURITY") == "curve" else lanes == 1, listening


def test_a_long_peer_identity_is_cut_to_64_characters_in_the_log(attacked):
    c, *_ = attacked
    log = c.log("server 0")
    assert "...(250 bytes)" in log, f"the malformed message's sender is not named, cut:\n{log}"
    assert "x" * 65 not in log, "a log line quotes more than 64 characters of a peer's identity"


# ---- starting by hand ---------------------------------------------------------

def _launch(env: dict[str, str], args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "GRADPRESS_", "PS_"))}
    return subprocess.run([sys.executable, "-m", "gradpress.launcher", *args], env=dict(base, **env),
                          capture_output=True, text=True, timeout=60, cwd=REPO)


@pytest.mark.parametrize("role", ["scheduler", "server", "worker"])
def test_a_role_started_by_hand_without_a_secret_refuses_saying_what_to_set(role):
    out = _launch({"DMLC_ROLE": role}, ("--", sys.executable, "-c", "print('training')") if role == "worker" else ())
    assert out.returncode == 2, out
    for setting in ("GRADPRESS_JOB_SECRET", "GRADPRESS_JOB_SECRET_FILE", "GRADPRESS_INSECURE=1"):
        assert setting in out.stderr, f"the error does not name {setting}:\n{out.stderr}"
    assert "training" not in out.stdout


def test_insecure_starts_with_a_warning(tmp_path):
    out = _launch({"DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_PORT": "0", "GRADPRESS_INSECURE": "1",
                   "GRADPRESS_CONNECT_TIMEOUT_S": "0.3", "GRADPRESS_PORT_FILE": str(tmp_path / "port")})
    assert (tmp_path / "port").exists(), f"the insecure scheduler did not start:\n{out.stderr}"
    assert "GRADPRESS_INSECURE=1" in out.stderr and "neither authenticated nor encrypted" in out.stderr, out.stderr
    assert "no address book" in out.stderr or "registered" in out.stderr, out.stderr


def test_a_bad_secret_file_is_named(tmp_path):
    short = tmp_path / "short"
    short.write_text("tooshort\n")
    out = _launch({"DMLC_ROLE": "scheduler", "GRADPRESS_JOB_SECRET_FILE": str(short)})
    assert out.returncode == 2 and f"GRADPRESS_JOB_SECRET_FILE={short}" in out.stderr, out.stderr
    assert "8 characters" in out.stderr, out.stderr
