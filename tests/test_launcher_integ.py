"""gradpress-launch: --local output and exit codes; the worker role as bpslaunch."""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integ

PRINT_RANKS = """
import os, gradpress.torch as bps
bps.init()
print(f"rank {bps.rank()} of {bps.size()} local {bps.local_rank()}/{bps.local_size()} "
      f"omp {os.environ.get('OMP_NUM_THREADS')} gpus {os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
bps.shutdown()
"""


def test_local_job_prefixes_output_with_role_and_rank_and_exits_zero(tmp_path):
    """Each of --local's workers, a machine of its own, sees one of the visible GPUs (here
    GPUs 4 and 6 of CUDA_VISIBLE_DEVICES, which this CPU build of torch does not look for)."""
    script = tmp_path / "w.py"
    script.write_text(PRINT_RANKS)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-m", "gradpress.launcher", "--local", "--workers", "2", "--servers", "2",
                          "--", sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env=dict(env, CUDA_VISIBLE_DEVICES="4, 6"))
    assert out.returncode == 0, out.stdout + out.stderr
    from gradpress.host import cores as host_cores
    cores = int(host_cores())
    for r, gpu in enumerate(("4", "6")):
        assert f"[worker {r}] rank {r} of 2 local 0/1 omp {max(1, cores // 2)} gpus {gpu}" in out.stdout, out.stdout


@pytest.mark.parametrize("visible, gpus", [("0,1", ["0", "1", "0"]), ("GPU-a,GPU-b,GPU-c", ["GPU-a", "GPU-b", "GPU-c"]),
                                            ("3", [None] * 3), ("", [None] * 3)])
def test_local_workers_share_the_visible_gpus_round_robin(visible, gpus):
    """Several GPUs: worker i sees the (i mod n)-th alone; one GPU or none: the environment
    is left as it is."""
    from gradpress.launcher import _gpu_of
    assert [_gpu_of(i, {"CUDA_VISIBLE_DEVICES": visible}).get("CUDA_VISIBLE_DEVICES") for i in range(3)] == gpus


def test_a_pods_cpu_request_is_shared_among_its_worker_processes():
    """On Kubernetes, GRADPRESS_CPUS is the pod's CPU request (a container sees every core of
    its node): gradpress-launch gives each of the processes it starts its share, and an
    explicit OMP_NUM_THREADS still wins."""
    from gradpress.launcher import _thread_share
    assert _thread_share(2, {"GRADPRESS_CPUS": "6"}) == {"OMP_NUM_THREADS": "3"}
    assert _thread_share(8, {"GRADPRESS_CPUS": "4"}) == {"OMP_NUM_THREADS": "1"}
    assert _thread_share(2, {"GRADPRESS_CPUS": "6", "OMP_NUM_THREADS": "5"}) == {}
    assert _thread_share(2, {}, cpus=6.0) == {"OMP_NUM_THREADS": "3"}  # (a job file's cpus, as the settings read it)
    from gradpress.config import Settings
    with pytest.raises(ValueError, match="GRADPRESS_CPUS=-2: must be a count of cores"):
        Settings.load({"GRADPRESS_CPUS": "-2"})


def test_worker_role_runs_one_process_per_local_slot(cluster):
    # one worker machine with two local workers: DMLC_NUM_WORKER=1, BYTEPS_LOCAL_SIZE=2
    c = cluster(workers=1, servers=1)
    c.start_scheduler()
    c.start_server(0)
    script = c.tmp / "w.py"
    script.write_text(PRINT_RANKS)
    # the worker machine's launcher starts both local workers
    c.start_worker(0, [sys.executable, "-m", "gradpress.launcher", sys.executable, str(script)], BYTEPS_LOCAL_SIZE="2")
    c.assert_success(120)
    log = c.log("worker 0")
    assert "rank 0 of 2 local 0/2" in log and "rank 1 of 2 local 1/2" in log, log


IGNORES_SIGTERM = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a child that would outlive a launcher killed at once
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(600)
"""


def test_a_terminated_launcher_stops_its_children_and_exits_143(tmp_path):
    """SIGTERM (a pod deleted) stops the job as Ctrl-C does: children sent SIGTERM, then
    SIGKILL, even one that ignores SIGTERM; the launcher exits 128 + 15. It used to die at
    once and leave such a child running (and, as a container's PID 1, to ignore SIGTERM)."""
    import signal
    import time
    script, pid_file = tmp_path / "w.py", tmp_path / "pid"
    script.write_text(IGNORES_SIGTERM)
    launcher = subprocess.Popen([sys.executable, "-m", "gradpress.launcher", "--local", "--workers", "1",
                                 "--servers", "1", "--", sys.executable, str(script), str(pid_file)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    child = None
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        child = int(pid_file.read_text())
        launcher.send_signal(signal.SIGTERM)
        out, _ = launcher.communicate(timeout=30)
        assert launcher.returncode == 143, out
        assert "stopped by SIGTERM" in out, out
        time.sleep(0.5)
        assert not os.path.exists(f"/proc/{child}") or " Z " in open(f"/proc/{child}/stat").read(), \
            "a child outlived its terminated launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if child is not None and os.path.exists(f"/proc/{child}"):
            os.kill(child, signal.SIGKILL)


PUSHES_UNTIL_STOPPED = """
import sys, time, torch, gradpress.torch as bps
bps.init()
t = torch.ones(1 << 16)
bps.push_pull(t, name="t")
open(sys.argv[1] + str(bps.rank()), "w").write("in")
for _ in range(1200):  # 60 s
    bps.push_pull(t, name="t")
    time.sleep(0.05)
"""


def _child_with(parent: int, **env: str) -> int:
    """The pid of ``parent``'s child whose environment holds ``env``."""
    for child in open(f"/proc/{parent}/task/{parent}/children").read().split():
        environ = dict(item.split("=", 1) for item in open(f"/proc/{child}/environ").read().split("\0") if "=" in item)
        if all(environ.get(k) == v for k, v in env.items()):
            return int(child)
    raise AssertionError(f"no child of {parent} with {env}")


def test_a_server_killed_outright_is_reported_by_its_launcher_and_the_job_stops_at_once(tmp_path):
    """kill -9 of a --local job's server: its launcher tells the scheduler, which stops every
    node naming it; the scheduler used to find it at its silence, PS_HEARTBEAT_TIMEOUT later
    (30 s here), and the workers pushed on meanwhile."""
    import signal
    import time
    script, ready = tmp_path / "w.py", tmp_path / "ready"
    script.write_text(PUSHES_UNTIL_STOPPED)
    launcher = subprocess.Popen([sys.executable, "-m", "gradpress.launcher", "--local", "--workers", "2",
                                 "--servers", "2", "--", sys.executable, str(script), str(ready)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ, PS_HEARTBEAT_TIMEOUT="30"))
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready{r}").exists() for r in range(2)) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(_child_with(launcher.pid, DMLC_ROLE="server", GRADPRESS_SERVER_ID="1"), signal.SIGKILL)
        killed = time.monotonic()
        out, _ = launcher.communicate(timeout=60)
        took = time.monotonic() - killed
        assert launcher.returncode == 137, out
        assert "[scheduler]" in out and "server 1 failed: was killed by signal 9" in out, out
        assert "lost server 1: failed: was killed by signal 9" in out, out
        assert took < 15, f"the job took {took:.1f} s to stop (PS_HEARTBEAT_TIMEOUT=30):\n{out}"
    finally:
        if launcher.poll() is None:
            launcher.kill()


class _ServerJob:
    """An in-process scheduler of a job of one worker (a link, registered by ``start``) and one
    server, started by the launcher as a pod starts it (``launch_server``)."""

    def __init__(self):
        import threading

        from cluster import TEST_SECRET
        from gradpress.config import Settings
        from gradpress.net import transport
        from gradpress.net.node import SchedulerLink
        from gradpress.scheduler.scheduler import Scheduler
        common = dict(num_worker=1, num_server=1, root_uri="127.0.0.1", node_host="127.0.0.1",
                      heartbeat_interval_s=0.2, heartbeat_timeout_s=60, connect_timeout_s=60, job_secret=TEST_SECRET)
        self.scheduler = Scheduler(Settings(role="scheduler", root_port=0, **common))
        threading.Thread(target=self.scheduler.run, daemon=True).start()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "GRADPRESS_", "PS_"))}
        self.env = dict(env, DMLC_ROLE="server", DMLC_NUM_WORKER="1", DMLC_NUM_SERVER="1",
                        DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(self.scheduler.port),
                        DMLC_NODE_HOST="127.0.0.1", GRADPRESS_JOB_SECRET=TEST_SECRET, PS_HEARTBEAT_INTERVAL="0.2",
                        PS_HEARTBEAT_TIMEOUT="60")
        self.servers: list[subprocess.Popen] = []
        self.worker = SchedulerLink(Settings(role="worker", root_port=self.scheduler.port, **common), "worker",
                                    transport.context())

    def launch_server(self) -> subprocess.Popen:
        self.servers.append(subprocess.Popen([sys.executable, "-m", "gradpress.launcher"], env=self.env,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        return self.servers[-1]

    def node_lost(self, within_s: float) -> dict | None:
        """The NODE_LOST the worker hears within ``within_s`` seconds, or None."""
        import time

        from gradpress.net import transport
        from gradpress.net.protocol import Op
        deadline = time.monotonic() + within_s
        while self.worker.sock.poll(max(0.0, deadline - time.monotonic()) * 1000):
            _, header, _ = transport.recv(self.worker.sock, routed=False)
            if header is not None and header["op"] == Op.NODE_LOST:
                return header
        return None

    def close(self) -> None:
        self.scheduler.exit_code = 0
        self.worker.close()
        for server in self.servers:
            if server.poll() is None:
                server.kill()


def test_a_terminated_server_tells_the_scheduler_so_every_worker_hears_it_at_once():
    """A server pod deleted: its launcher's SIGTERM reaches the workers as NODE_LOST naming
    the server and the signal, not as its silence a heartbeat timeout later."""
    import signal
    job = _ServerJob()
    try:
        server = job.launch_server()
        job.worker.register()
        server.send_signal(signal.SIGTERM)
        lost = job.node_lost(20)
        if lost is None:
            server.kill()
            raise AssertionError(f"the workers heard nothing within 20 s; the server said:\n{server.communicate()[0]}")
        assert (lost["role"], lost["rank"]) == ("server", 0) and "stopped by SIGTERM" in lost["reason"], lost
        server.wait(30)
    finally:
        job.close()


def test_a_server_refused_at_registration_leaves_the_running_job_alone():
    """A server pod restarted into a running job is refused ("registration is closed"): it
    stops, and the job it could not join goes on (the scheduler's word is no failure of its
    to report)."""
    job = _ServerJob()
    try:
        job.launch_server()
        job.worker.register()
        late = job.launch_server()
        out, _ = late.communicate(timeout=60)
        assert late.returncode != 0 and "registration" in out, out
        assert job.node_lost(2) is None and job.scheduler.exit_code is None, "a refused server ended the job"
    finally:
        job.close()
