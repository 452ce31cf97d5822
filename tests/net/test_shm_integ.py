"""Shared memory in real jobs (issue 14): many tensors under a low descriptor limit, a local
process that tries to shrink the job's memory, and kill -9 of a server leaving nothing behind."""
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cluster import FAST, job_leftovers

pytestmark = pytest.mark.integ

CLIENT = """
import os, time, numpy as np
from pathlib import Path
from gradpress.config import Settings
from gradpress.worker import WorkerClient
c = WorkerClient(Settings.load(os.environ))
c.start()
r, n = c.rank, c.size
d = Path(os.environ["GP_TEST_DIR"])
assert all(c.comm.stages.local), "the servers are on this host: shared memory must be in use"
"""

MANY_TENSORS = CLIENT + """
count = int(os.environ["GP_TENSORS"])
outs = []
for i in range(count):  # tiny tensors: what matters is how many there are
    src = np.full(3, float(i + r), np.float32)
    out = np.empty_like(src)
    outs.append((c.push_pull_async(f"t{i}", src, out, 1, 0), out, n * i + n * (n - 1) / 2))
for i, (fut, out, want) in enumerate(outs):
    fut.result(60)
    assert np.all(out == want), (i, out, want)
print(f"OK {r} fds {len(os.listdir('/proc/self/fd'))}", flush=True)
c.finish()
"""


def test_a_thousand_tensors_with_eight_local_workers_under_ulimit_n_256(cluster):
    c = cluster(workers=8, servers=1, env={"BYTEPS_SERVER_ENGINE_THREAD": "2"})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # the job's processes inherit it
    try:
        c.start(MANY_TENSORS, worker_env={"GP_TENSORS": "1000"})
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    c.assert_success(150)
    for i in range(8):
        assert "OK" in c.log(f"worker {i}"), c.log(f"worker {i}")


# Rounds of 8 tensors until the test says it attacked, then 20 more; every sum checked.
# Whether the attack happened travels in the sum too, so that every worker counts the
# same rounds (each reading the file itself, one could see it a round later than the
# other and wait forever for a round the other never starts).
ROUNDS = CLIENT + """
rnd = after = 0
while after < int(os.environ.get("GP_AFTER", "20")):
    futs = []
    for i in range(8):
        src = np.full(1000 + i, float(rnd + i + r), np.float32)
        out = np.empty_like(src)
        futs.append((c.push_pull_async(f"t{i}", src, out, 1, 0), out, n * (rnd + i) + n * (n - 1) / 2))
    seen = np.array([float((d / "attacked").exists())], np.float32)
    attacked = np.empty_like(seen)
    flag = c.push_pull_async("attacked", seen, attacked, 1, 0)
    for fut, out, want in futs:
        fut.result(30)
        assert np.all(out == want), (rnd, out[:3], want)
    flag.result(30)
    rnd += 1
    after += bool(attacked[0] > 0)
    (d / f"rounds{r}").write_text(str(rnd))
print(f"OK {r} {rnd}", flush=True)
c.finish()
"""


def _memfds(pid: int) -> list[str]:
    """The gradpress memfd descriptors a process holds, as /proc paths."""
    found = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:gradpress-"):
                    found.append(f"/proc/{pid}/fd/{fd}")
            except OSError:
                pass
    except OSError:
        pass
    return found


def _shared_memory(pid: int) -> list[str]:
    """What a process maps of gradpress's shared memory (memfd chunks, or files in /dev/shm)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return [line for line in maps.splitlines() if "memfd:gradpress-" in line or "/dev/shm/gradpress-" in line]


def _wait_for(condition, timeout_s: float, what: str, logs=lambda: ""):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s\n{logs()}")
        time.sleep(0.05)


def test_a_local_process_cannot_shrink_the_jobs_memory_and_the_sums_stay_right(cluster):
    c = cluster(workers=2, servers=1).start(ROUNDS)
    _wait_for(lambda: all((c.tmp / f"rounds{r}").exists() for r in (0, 1)), 60, "rounds", c.logs)
    targets = [p for name, proc in c.procs.items() if name != "scheduler" for p in _memfds(proc.pid)]
    targets += [str(p) for p in Path("/dev/shm").glob("gradpress-*")]  # where older versions kept it
    assert len(targets) >= 3, f"expected the workers' push chunks and the server's result chunks: {targets}"
    refused = 0
    for path in targets:  # what any process of this user could do to the job's memory
        fd = os.open(path, os.O_RDWR)
        try:
            os.ftruncate(fd, 0)
        except PermissionError:
            refused += 1
        finally:
            os.close(fd)
    (c.tmp / "attacked").write_text("")
    c.assert_success(60)  # 20 more rounds of exact sums: the server and the workers survived
    assert refused == len(targets), f"{len(targets) - refused} of {targets} could be shrunk"


def test_kill_9_of_a_server_by_hand_leaves_nothing_of_the_job(cluster):
    c = cluster(workers=2, servers=1, env={"PS_HEARTBEAT_TIMEOUT": "1.5"})
    c.start(ROUNDS, worker_env={"GP_AFTER": "1000000"})
    _wait_for(lambda: all((c.tmp / f"rounds{r}").exists() for r in (0, 1)), 60, "rounds", c.logs)
    pids = {p.pid for p in c.procs.values()}
    server = c.procs["server 0"]
    assert _shared_memory(server.pid), "the server maps no shared memory: the test would prove nothing"
    server.send_signal(signal.SIGKILL)
    codes = c.wait(30)  # the others notice, stop, and exit
    assert codes["server 0"] == -signal.SIGKILL and codes["worker 0"] != 0, codes
    assert not job_leftovers(pids), job_leftovers(pids)


def test_kill_9_of_a_server_under_the_launcher_leaves_nothing_of_the_job(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(ROUNDS))
    env = {**os.environ, **FAST, "PS_HEARTBEAT_TIMEOUT": "1.5", "GP_TEST_DIR": str(tmp_path),
           "GP_AFTER": "1000000"}
    launcher = subprocess.Popen([sys.executable, "-m", "gradpress.launcher", "--local", "--workers", "2",
                                 "--servers", "1", "--", sys.executable, str(script)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for(lambda: all((tmp_path / f"rounds{r}").exists() for r in (0, 1)) or launcher.poll() is not None,
                  60, "rounds")
        assert launcher.poll() is None, launcher.stdout.read().decode()
        children = [int(p) for p in Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()]
        servers = [p for p in children if b"DMLC_ROLE=server" in Path(f"/proc/{p}/environ").read_bytes().split(b"\0")]
        assert len(servers) == 1 and _shared_memory(servers[0]), (children, servers)
        os.kill(servers[0], signal.SIGKILL)
        out, _ = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode != 0, out.decode()
    assert not job_leftovers(set(children)), job_leftovers(set(children))
