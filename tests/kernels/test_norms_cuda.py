"""gradpress/kernels/cuda/norms.py and scratch.py under Numba's CUDA simulator: the device
reductions give kernels/reduction.py's bits (over chunk counts on both sides of the
one-block kernel's switch from global to shared memory), and pinned payload buffers are
reused only when nothing reads them. The simulator must be chosen before numba is
imported, so the cases run in a subprocess (cudasim_norms.py)."""
from pathlib import Path

import pytest
from cudasim_run import simulated_cases

SCRIPT = Path(__file__).with_name("cudasim_norms.py")


@pytest.mark.integ  # starts processes
@pytest.mark.timeout(300)
def test_device_norms_follow_the_one_summation_order():
    results = {c["case"]: c["problem"] for c in simulated_cases(SCRIPT, 280)}
    assert len([c for c in results if c.startswith("totals/")]) == 9
    assert len([c for c in results if c.startswith("chunks/")]) == 8
    assert {"pool/busy-not-reused", "pool/free-reused", "reuse/same-buffer"} <= set(results)
    failures = {case: problem for case, problem in results.items() if problem}
    assert not failures, f"device reductions or buffers wrong: {failures}"
