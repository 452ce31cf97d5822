"""Dead peers, garbage on the wire, disagreeing workers: clear errors, no hangs, sums stay right."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import msgpack
import pytest
import zmq

from gradpress.config import Settings
from gradpress.net import auth, protocol
from gradpress.net.protocol import Op

pytestmark = pytest.mark.integ
HEARTBEAT_TIMEOUT_S = 2.0

TRAIN_FOREVER = """
import os, time, torch, gradpress.torch as bps
bps.init()
open(os.path.join(os.environ["GP_TEST_DIR"], f"ready{bps.rank()}"), "w").close()
x = torch.ones(1000)
while True:
    bps.push_pull_inplace(x, average=True, name="w")
    time.sleep(0.01)
"""


def _wait_for(path, c, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared\n{c.logs()}"
        time.sleep(0.05)


@pytest.mark.parametrize("victim", ["worker 1", "server 0"])
def test_kill_9_stops_every_other_process_with_an_error_naming_the_lost_node(cluster, victim):
    c = cluster(workers=2, servers=1, env={"PS_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S)})
    c.start(TRAIN_FOREVER)
    for r in range(2):
        _wait_for(c.tmp / f"ready{r}", c)
    time.sleep(0.5)
    killed_at = time.monotonic()
    c.procs[victim].send_signal(signal.SIGKILL)
    survivors = [n for n in c.procs if n != victim]
    for name in survivors:
        try:
            code = c.procs[name].wait(timeout=2 * HEARTBEAT_TIMEOUT_S + 4)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still running {2 * HEARTBEAT_TIMEOUT_S + 4} s after "
                                 f"{victim} was killed\n{c.logs()}")
        assert code != 0, f"{name} exited 0 after {victim} died\n{c.logs()}"
        assert f"lost {victim}" in c.log(name), f"{name}'s error does not name {victim}:\n{c.log(name)}"
    elapsed = time.monotonic() - killed_at
    # detection within the heartbeat timeout, then every survivor's exit; measured 5.3 and 6.2 s
    # for a killed server while the suite runs two tests at once on 2 cores (4.x s alone)
    assert elapsed <= 2 * HEARTBEAT_TIMEOUT_S + 4, f"took {elapsed:.1f} s"


def test_a_stopped_worker_declared_lost_learns_so_when_it_runs_again(cluster):
    # before: resumed after the job had ended, it found the scheduler gone and blamed it
    c = cluster(workers=2, servers=1, env={"PS_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S)})
    c.start(TRAIN_FOREVER)
    for r in range(2):
        _wait_for(c.tmp / f"ready{r}", c)
    c.procs["worker 1"].send_signal(signal.SIGSTOP)
    try:
        for name in ("scheduler", "server 0", "worker 0"):
            assert c.procs[name].wait(timeout=2 * HEARTBEAT_TIMEOUT_S + 8) != 0, c.logs()
    finally:
        c.procs["worker 1"].send_signal(signal.SIGCONT)
    assert c.procs["worker 1"].wait(timeout=2 * HEARTBEAT_TIMEOUT_S + 8) != 0, c.logs()
    log = c.log("worker 1")
    assert "the scheduler lost worker 1 (this node" in log and "lost scheduler" not in log, c.logs()


def test_launcher_stops_the_job_and_exits_nonzero_when_a_process_dies(tmp_path):
    script = tmp_path / "w.py"
    script.write_text("import os, signal, time, gradpress.torch as bps\nbps.init()\n"
                      "if bps.rank() == 1: os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(60)\n")
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "gradpress.launcher", "--local", "--workers", "2",
                          "--servers", "1", "--", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=60,
                         # worker 0 sleeps outside gradpress: it exits when its grace (the heartbeat
                         # timeout, 10 s by default) is over, having been told of worker 1 at once
                         env=dict(os.environ, PYTHONUNBUFFERED="1", PS_HEARTBEAT_TIMEOUT="3"))
    assert out.returncode != 0, out
    assert "worker 1 exited with code -9" in out.stderr, out.stderr
    assert time.monotonic() - started < 30


GARBAGE_THEN_TRAIN = """
import json, os, time, torch, gradpress.torch as bps
from gradpress.torch import ops
bps.init()
r, n = bps.rank(), bps.size()
d = os.environ["GP_TEST_DIR"]
x = torch.full((3000,), float(r + 1))
bps.push_pull(x, average=False, name="w")  # the key exists before the garbage arrives
if r == 0:
    book = ops._require().book
    with open(os.path.join(d, "servers.json.part"), "w") as fh:  # renamed whole: the test never reads half
        json.dump([[s.host, s.port] for s in book.servers], fh)
    os.rename(os.path.join(d, "servers.json.part"), os.path.join(d, "servers.json"))
while not os.path.exists(os.path.join(d, "go")):
    time.sleep(0.05)
for rnd in range(5):
    got = bps.push_pull(torch.full((3000,), float(rnd + r + 1)), average=False, name="w")
    want = n * (rnd + 1) + n * (n - 1) / 2
    assert torch.all(got == want), (rnd, got[:3], want)
print("OK sums right after garbage", flush=True)
bps.shutdown()
"""


def _garbage_messages():
    def enc(**h) -> bytes:
        return msgpack.packb(h)
    v = protocol.PROTOCOL_VERSION
    return [
        [b"\x00\xffnot msgpack at all"],
        [msgpack.packb([1, 2, 3])],                                     # not a map
        [enc(v=v, op=int(Op.PUSH), **{"from": "x"}), b"1234"],           # missing fields
        [enc(v=v, op=int(Op.PUSH), key="k", round=0, dtype="float32", count=1, **{"from": "x"}), b"1234"],  # wrong type
        [enc(v=v, op=999, **{"from": "x"})],                              # unknown op
        [enc(v=v + 7, op=int(Op.HEARTBEAT), **{"from": "x"})],          # wrong version
        # unknown key
        [enc(v=v, op=int(Op.PUSH), key=123456789, round=0, dtype="float32", count=1, **{"from": "x"}), b"1234"],
        # wrong size for a real key
        [enc(v=v, op=int(Op.PUSH), key=1 << 16, round=0, dtype="float32", count=3000, **{"from": "x"}), b"12"],
        [enc(v=v, op=int(Op.PULL), key=1 << 16, round=99, **{"from": "x"})],  # stale/future round
        [enc(v=v, op=int(Op.REGISTER), role="worker", host="h", port=1, worker_id=0, local_rank=0,
             local_size=1, pid=1, **{"from": "x"})],                     # late registration
        [],                                                               # empty after identity
    ]


def test_garbage_to_server_and_scheduler_is_dropped_and_sums_stay_right(cluster):
    c = cluster(workers=2, servers=1)
    c.start(GARBAGE_THEN_TRAIN)
    _wait_for(c.tmp / "servers.json", c)
    targets = [tuple(s) for s in json.loads((c.tmp / "servers.json").read_text())] + [("127.0.0.1", c.port)]
    ctx = zmq.Context()
    keys = auth.job_keys(Settings(job_secret=c.secret))
    try:
        for host, port in targets:
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            auth.make_client(dealer, keys)  # a member gone wrong: outsiders are tests/net/test_auth_integ.py's
            dealer.connect(f"tcp://{host}:{port}")
            for msg in _garbage_messages():
                if msg:
                    dealer.send_multipart(msg)
            time.sleep(0.2)
            dealer.close()
            with socket.create_connection((host, port), timeout=5) as raw:  # not even ZMTP
                raw.sendall(os.urandom(4096))
    finally:
        ctx.destroy(linger=0)  # a socket left with unsent messages must not block the teardown
    time.sleep(0.3)
    (c.tmp / "go").touch()
    c.assert_success()
    assert "OK sums right after garbage" in c.log("worker 0")
    assert "dropped a malformed message" in c.log("server 0"), c.log("server 0")
    assert "dropped a malformed message" in c.log("scheduler"), c.log("scheduler")


MISMATCH = """
import os, time, torch, gradpress.torch as bps
from gradpress.errors import TensorMismatchError
bps.init()
r = bps.rank()
try:
    bps.push_pull(torch.ones(10 + 2 * r), name="weights")
    raise SystemExit("no error for mismatched sizes")
except TensorMismatchError as e:
    assert "'weights'" in str(e) and "disagree" in str(e), e
try:
    bps.push_pull(torch.ones(5, dtype=torch.float64 if r else torch.float32), name="bias")
    raise SystemExit("no error for mismatched dtypes")
except TensorMismatchError as e:
    assert "'bias'" in str(e) and "float64" in str(e), e
if r == 0:  # only worker 0 uses this tensor: a deadline, not a hang
    try:
        bps.push_pull(torch.ones(3), name="lonely")
        raise SystemExit("no error for a tensor only one worker uses")
    except TensorMismatchError as e:
        assert "'lonely'" in str(e) and "not by worker(s) [1]" in str(e), e
    open(os.path.join(os.environ["GP_TEST_DIR"], "lonely_done"), "w").close()
else:  # wait without touching gradpress until worker 0 has seen its deadline pass
    while not os.path.exists(os.path.join(os.environ["GP_TEST_DIR"], "lonely_done")):
        time.sleep(0.05)
# the job still works after those errors
assert torch.all(bps.push_pull(torch.ones(4), average=False, name="fine") == 2)
print("OK errors named the tensors", flush=True)
bps.shutdown()
"""


def test_workers_disagreeing_on_a_tensor_get_an_error_naming_it(cluster):
    c = cluster(workers=2, servers=1, env={"GRADPRESS_OP_TIMEOUT_S": "3"})
    c.start(MISMATCH).assert_success()
    assert "OK errors named the tensors" in c.log("worker 0") and "OK" in c.log("worker 1")


def test_a_node_that_never_comes_is_a_deadline_not_a_hang(cluster):
    # only the scheduler and one worker: the second worker and the server never come
    c = cluster(workers=2, servers=1, env={"GRADPRESS_CONNECT_TIMEOUT_S": "8"})
    c.start_scheduler()
    c.start_worker(0, [sys.executable, "-c", "import gradpress.torch as bps; bps.init()"],
                   GRADPRESS_CONNECT_TIMEOUT_S="3")
    codes = c.wait(timeout_s=30)
    assert codes["scheduler"] != 0 and codes["worker 0"] != 0, c.logs()
    assert "registration timed out" in c.log("worker 0") or "no address book" in c.log("worker 0"), c.logs()
    assert ("1 worker process(es) of 2 machine(s) and 0 of 1 server(s) registered; missing "
            "DMLC_WORKER_ID/BYTEPS_LOCAL_RANK 1/0") in c.log("scheduler"), c.logs()


def test_a_worker_refused_at_registration_stops_the_job_at_once_naming_why(cluster):
    # both workers claim DMLC_WORKER_ID=0: the second is refused, and nobody waits for it
    c = cluster(workers=2, servers=1, env={"GRADPRESS_CONNECT_TIMEOUT_S": "60"})
    c.start("import gradpress.torch as bps\nbps.init()\nbps.shutdown()\n",
            each_worker=[{"DMLC_WORKER_ID": "0"}, {"DMLC_WORKER_ID": "0"}])
    start = time.monotonic()
    codes = c.wait(timeout_s=45)
    assert time.monotonic() - start < 30, f"the job took {time.monotonic() - start:.0f} s to stop"
    assert all(code != 0 for code in codes.values()), c.logs()
    refused = [i for i in range(2) if "refused registration" in c.log(f"worker {i}")]
    assert refused and all("is already taken" in c.log(f"worker {i}") for i in refused), c.logs()
    assert "worker (pid" in c.log("scheduler"), c.logs()  # named by pid, not by the slot it asked for
    kept = [i for i in range(2) if i not in refused]
    for name in [f"worker {i}" for i in kept] + ["server 0"]:  # the others too: it had no rank (was "worker -1")
        assert "lost worker (pid" in c.log(name) and "worker -1" not in c.log(name), c.logs()


def test_nodes_that_register_early_are_not_lost_while_the_rest_arrive(cluster):
    # the server registers, then the workers take longer than the heartbeat timeout to arrive
    c = cluster(workers=2, servers=1, env={"PS_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S)})
    c.start_scheduler()
    c.start_server(0)
    time.sleep(2 * HEARTBEAT_TIMEOUT_S)
    script = c.tmp / "w.py"
    script.write_text("import torch, gradpress.torch as bps\nbps.init()\n"
                      "assert bps.push_pull(torch.ones(3), average=False, name='x')[0] == 2\nbps.shutdown()\n")
    for i in range(2):
        c.start_worker(i, [sys.executable, str(script)])
    c.assert_success(60)


UNEVEN_STEPS = """
import torch, gradpress.torch as bps
bps.init()
x, big = torch.ones(1000), torch.ones(100_000)  # big: summed on a server's engine thread, not its I/O thread
for step in range(3 if bps.rank() == 0 else 2):  # worker 1 runs one step fewer, then its script ends
    bps.push_pull_inplace(big, average=True, name="big")
    bps.push_pull_inplace(x, average=True, name="w")
print("all steps done", flush=True)
"""


def test_a_worker_that_runs_fewer_steps_stops_the_others_at_once_naming_it_and_every_process_fails(cluster):
    # before: worker 0 waited out the op deadline, then the job named worker 0 as the failed one,
    # and worker 1, whose exit handler's error Python ignores, exited 0
    c = cluster(workers=2, servers=1, env={"GRADPRESS_OP_TIMEOUT_S": "60", "BYTEPS_SERVER_ENGINE_THREAD": "1"})
    started = time.monotonic()
    codes = c.start(UNEVEN_STEPS).wait(55)
    assert all(code != 0 for code in codes.values()), f"exit codes {codes}\n{c.logs()}"
    assert "worker 1 finished" in c.log("worker 0") and "all steps done" not in c.log("worker 0"), c.logs()
    assert "tensor 'big'" in c.log("worker 0"), c.log("worker 0")  # the engine thread's key failed
    assert "worker 1 finished" in c.log("worker 1"), c.log("worker 1")  # the reason reaches it too
    assert "dropped unexpected" not in c.log("worker 0"), c.log("worker 0")  # (LEFT: no local group here)
    assert time.monotonic() - started < 40, f"the job took {time.monotonic() - started:.0f} s\n{c.logs()}"


HUNG_WORKER = """
import time, torch, gradpress.torch as bps
bps.init()
x, big = torch.ones(1000), torch.ones(100_000)  # big: summed on a server's engine thread, x on its I/O thread
for step in range(2):
    if bps.rank() == 1 and step == 1:
        time.sleep(4.5)  # its training loop stalls, its heartbeats go on; then it finds the job ended
    bps.push_pull_inplace(big, average=True, name="big")
    bps.push_pull_inplace(x, average=True, name="w")
"""


def test_a_worker_whose_loop_hangs_is_named_in_the_deadline_error_of_the_worker_that_waited(cluster):
    # before: worker 0's error named only server 0, and the job said "worker 0 failed"
    c = cluster(workers=2, servers=1, env={"GRADPRESS_OP_TIMEOUT_S": "3", "BYTEPS_SERVER_ENGINE_THREAD": "1"})
    codes = c.start(HUNG_WORKER).wait(45)
    assert all(code != 0 for code in codes.values()), f"exit codes {codes}\n{c.logs()}"
    said = r"no reply within GRADPRESS_OP_TIMEOUT_S=3 s; server 0 waits for the push of worker 1 \(at \d s it had " \
           r"worker 0's\)"  # (at 1.5 s)
    assert re.search(said, c.log("worker 0")) and re.search(said, c.log("scheduler")), c.logs()
    assert re.search(r"tensor 'big'\), round 1: server 0 waits for the push of worker 1", c.log("server 0")), \
        c.log("server 0")

def test_a_worker_that_finishes_early_waits_for_the_others_without_losing_the_scheduler(cluster):
    c = cluster(workers=2, servers=1, env={"PS_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S)})
    c.start("import time, torch, gradpress.torch as bps\nbps.init()\n"
            "bps.push_pull(torch.ones(3), name='x')\n"
            "if bps.rank() == 1: time.sleep(3 * %s)\n"
            "bps.shutdown()\nprint('done', flush=True)\n" % HEARTBEAT_TIMEOUT_S)
    c.assert_success(60)
    assert "done" in c.log("worker 0")
