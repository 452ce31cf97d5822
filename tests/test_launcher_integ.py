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
      f"omp {os.environ.get('OMP_NUM_THREADS')}", flush=True)
bps.shutdown()
"""


def test_local_job_prefixes_output_with_role_and_rank_and_exits_zero(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(PRINT_RANKS)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-m", "gradpress.launcher", "--local", "--workers", "2", "--servers", "2",
                          "--", sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    cores = os.cpu_count() or 1
    for r in range(2):
        assert f"[worker {r}] rank {r} of 2 local 0/1 omp {max(1, cores // 2)}" in out.stdout, out.stdout


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
