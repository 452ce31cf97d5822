"""The health file the probes read (gradpress/health.py, docs/deploy.md "Probes")."""
import os
import threading
import time

import pytest

from gradpress.health import FINISHED, HealthFile, container_start, main as health


def test_a_pods_processes_writing_the_file_at_once_never_fail(tmp_path):
    # gradpress-launch starts one training process per GPU, all given the pod's one file
    path, errors = str(tmp_path / "health"), []
    files = [HealthFile(path) for _ in range(4)]

    def register(i):
        try:
            for _ in range(300):
                files[i].ready(f"worker {i} registered")
        except OSError as e:
            errors.append(e)
    threads = [threading.Thread(target=register, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert open(path).read().startswith("ready worker ")
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


needs_proc = pytest.mark.skipif(container_start() is None, reason="/proc does not say when PID 1 started")


@needs_proc
def test_a_file_left_from_before_the_container_started_is_not_ready(tmp_path, capsys):
    # an emptyDir outlives a container's restart: the old process's file must not pass the
    # new container's startup probe before the new process has registered
    path = tmp_path / "health"
    h = HealthFile(str(path))
    h.ready("server 0 registered")
    assert health(["ready", "--file", str(path)]) == 0
    before = container_start() - 5
    os.utime(path, (before, before))
    assert health(["ready", "--file", str(path)]) == 1
    assert health(["live", "--file", str(path), "--max-age", "1e9"]) == 1
    assert "before this container started" in capsys.readouterr().err


@needs_proc
def test_a_node_that_left_its_job_stays_live_while_its_loop_beats_no_more(tmp_path, capsys):
    old = time.time() - 120
    if container_start() > old - 2:
        pytest.skip("PID 1 started less than two minutes ago")
    running, left = HealthFile(str(tmp_path / "running")), HealthFile(str(tmp_path / "left"))
    running.ready("worker 0 registered")
    left.ready("worker 1 registered")
    left.finished("worker 1 left the job")
    left.beat()  # no more beats once finished: nothing to touch
    for h in (running, left):
        os.utime(h.path, (old, old))
    assert health(["live", "--file", running.path, "--max-age", "60"]) == 1
    assert "last touched" in capsys.readouterr().err
    assert health(["live", "--file", left.path, "--max-age", "60"]) == 0
    assert health(["ready", "--file", left.path]) == 0
    assert open(left.path).read().split()[0] == FINISHED


def test_finished_before_ready_writes_nothing(tmp_path):
    h = HealthFile(str(tmp_path / "health"))
    h.finished("worker 0 left the job")  # never registered: no probe may pass
    assert not (tmp_path / "health").exists()
    HealthFile("").ready("x")  # no file configured: nothing, no error
    HealthFile("").finished("x")


AFTER_SHUTDOWN = """
import os, subprocess, sys, time, torch, gradpress.torch as bps
bps.init()
bps.push_pull(torch.ones(3), name="x")
path = os.environ["GRADPRESS_HEALTH_FILE"]
assert open(path).read().startswith("ready "), open(path).read()
bps.shutdown()
time.sleep(1.5)  # a script evaluating or saving after training: the loop beats no more
probe = subprocess.run([sys.executable, "-m", "gradpress.health", "live", "--max-age", "1"],
                       capture_output=True, text=True)
assert probe.returncode == 0, (open(path).read(), probe.stderr)
print("live after shutdown:", open(path).read().strip())
"""


@pytest.mark.integ
def test_a_worker_after_shutdown_stays_live_for_its_liveness_probe(cluster, tmp_path):
    c = cluster()
    c.start(AFTER_SHUTDOWN, each_worker=[{"GRADPRESS_HEALTH_FILE": str(tmp_path / f"health{i}")} for i in range(2)])
    c.assert_success()
    for i in range(2):
        assert f"live after shutdown: {FINISHED} worker {i} left the job" in c.log(f"worker {i}"), c.logs()
