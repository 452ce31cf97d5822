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
    cores = os.cpu_count() or 1
    for r, gpu in enumerate(("4", "6")):
        assert f"[worker {r}] rank {r} of 2 local 0/1 omp {max(1, cores // 2)} gpus {gpu}" in out.stdout, out.stdout


@pytest.mark.parametrize("visible, gpus", [("0,1", ["0", "1", "0"]), ("GPU-a,GPU-b,GPU-c", ["GPU-a", "GPU-b", "GPU-c"]),
                                            ("3", [None] * 3), ("", [None] * 3)])
def test_local_workers_share_the_visible_gpus_round_robin(visible, gpus):
    """Several GPUs: worker i sees the (i mod n)-th alone; one GPU or none: the environment
    is left as it is."""
    from gradpress.launcher import _gpu_of
    assert [_gpu_of(i, {"CUDA_VISIBLE_DEVICES": visible}).get("CUDA_VISIBLE_DEVICES") for i in range(3)] == gpus


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
