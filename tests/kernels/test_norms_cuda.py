"""gradpress/kernels/cuda/norms.py and scratch.py under Numba's CUDA simulator: the device
reductions give kernels/reduction.py's bits (over chunk counts on both sides of the
one-block kernel's switch from global to shared memory), and pinned payload buffers are
reused only when nothing reads them. The simulator must be chosen before numba is
imported, so the cases run in a subprocess (cudasim_norms.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("cudasim_norms.py")
REPO = SCRIPT.parents[2]


@pytest.mark.integ  # starts processes
@pytest.mark.timeout(300)
def test_device_norms_follow_the_one_summation_order():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, str(SCRIPT)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=280)
    assert run.returncode == 0, f"simulator run failed:\n{run.stderr[-4000:]}"
    results = {c["case"]: c["problem"] for c in map(json.loads, run.stdout.splitlines())}
    assert len([c for c in results if c.startswith("totals/")]) == 9
    assert len([c for c in results if c.startswith("chunks/")]) == 7
    assert {"pool/busy-not-reused", "pool/free-reused", "reuse/same-buffer"} <= set(results)
    failures = {case: problem for case, problem in results.items() if problem}
    assert not failures, f"device reductions or buffers wrong: {failures}"
