"""The failing-worker drill: a worker that raises, calls os._exit(3), fails in init(), or
whose communication thread fails (a bug, a CUDA error on it) stops the whole job in under
2x PS_HEARTBEAT_TIMEOUT, and every survivor's error names the failed worker (and its first
error line when it had one), never a tensor mismatch. Both launches: processes started by
hand (DMLC_* variables) and ``gradpress-launch --local``. A worker interrupted (Ctrl-C) is
reported as the others are.
"""
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integ
HEARTBEAT_TIMEOUT_S = 4.0
LIMIT_S = 2 * HEARTBEAT_TIMEOUT_S

# Worker 1 fails at step 3 (or in init); worker 0 declares a new tensor every step, so
# that without ABORT it would wait at a declaration and blame a mismatch on worker 1.
DRILL = """
import os, time, torch
mode = os.environ["GP_MODE"]
if mode == "init" and os.environ["DMLC_WORKER_ID"] == "1":
    os.environ["DMLC_ENABLE_RDMA"] = "1"      # a mode gradpress refuses at init()
import gradpress.torch as bps
if mode == "init" and os.environ["DMLC_WORKER_ID"] == "1":
    with open(os.environ["GP_FAILED_AT"], "w") as fh:   # the clock starts at the failing call,
        fh.write(repr(time.time()))                     # not at the (load-dependent) imports
bps.init()
r = bps.rank()
for step in range(1000):
    if r == 1 and step == 3:
        with open(os.environ["GP_FAILED_AT"], "w") as fh:
            fh.write(repr(time.time()))
        if mode == "raise":
            raise ValueError("boom at step 3")
        if mode == "interrupt":  # Ctrl-C on one worker: the others must not wait for its pushes
            raise KeyboardInterrupt
        if mode == "comm":  # only the thread's own report can tell the scheduler why
            from gradpress.torch import ops
            comm = ops.client().comm
            def boom():
                raise RuntimeError("comm boom")
            comm.flight.dispatch = boom
            comm.wake()
            comm.join(30)
            raise SystemExit(1)
        os._exit(3)
    bps.push_pull(torch.ones(100), name=f"w{step}")
"""

EXPECT = {"raise": ["ValueError: boom at step 3"], "exit": [], "init": ["DMLC_ENABLE_RDMA"],
          "interrupt": ["interrupted (Ctrl-C)"],
          "comm": ["worker communication thread failed: RuntimeError('comm boom')"]}


def _failed_at(tmp, started):
    path = tmp / "failed_at"
    return float(path.read_text()) if path.exists() else started


@pytest.mark.parametrize("mode", ["raise", "exit", "init", "comm", "interrupt"])
def test_by_hand_launch_stops_every_process_naming_the_failed_worker(cluster, mode):
    c = cluster(workers=2, servers=1, env={"PS_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S),
                                           "GRADPRESS_OP_TIMEOUT_S": "120"})
    started = time.time()
    c.start(DRILL, worker_env={"GP_MODE": mode, "GP_FAILED_AT": str(c.tmp / "failed_at")})
    codes = c.wait(timeout_s=90)
    elapsed = max(p_end - _failed_at(c.tmp, started) for p_end in [time.time()])
    assert all(code != 0 for code in codes.values()), f"exit codes {codes}\n{c.logs()}"
    assert elapsed < LIMIT_S + 1, f"the job took {elapsed:.1f} s to stop after worker 1 failed\n{c.logs()}"
    for name in ("worker 0", "server 0"):
        log = c.log(name)
        assert "worker 1" in log and all(e in log for e in EXPECT[mode]), f"{name} does not say why:\n{log}"
        assert "TensorMismatch" not in log and "declared by" not in log, f"{name} blames a mismatch:\n{log}"
    if mode != "exit":
        assert "failed" in c.log("scheduler") and all(e in c.log("scheduler") for e in EXPECT[mode]), c.logs()


@pytest.mark.parametrize("mode", ["raise", "exit"])
def test_local_launch_stops_the_job_and_exits_with_the_workers_code(tmp_path, mode):
    script = tmp_path / "w.py"
    script.write_text(DRILL)
    env = dict(os.environ, PS_HEARTBEAT_TIMEOUT=str(HEARTBEAT_TIMEOUT_S), PS_HEARTBEAT_INTERVAL="0.2",
               GRADPRESS_OP_TIMEOUT_S="120", GP_MODE=mode, GP_FAILED_AT=str(tmp_path / "failed_at"),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    started = time.time()
    out = subprocess.run([sys.executable, "-m", "gradpress.launcher", "--local", "--workers", "2", "--servers", "1",
                          "--", sys.executable, str(script)], capture_output=True, text=True, timeout=90, env=env)
    elapsed = time.time() - _failed_at(tmp_path, started)
    code = {"raise": 1, "exit": 3}[mode]
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    assert f"worker 1 exited with code {code}" in out.stderr, out.stderr
    assert elapsed < LIMIT_S + 1, f"took {elapsed:.1f} s\n{out.stdout}\n{out.stderr}"
    survivor = "\n".join(line for line in out.stdout.splitlines() if line.startswith("[worker 0]"))
    why = EXPECT[mode] or ["exited with code 3"]
    assert "lost worker 1" in survivor and all(e in survivor for e in why), f"worker 0 says:\n{survivor}\n{out.stderr}"
    assert "TensorMismatch" not in out.stdout
