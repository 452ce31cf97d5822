"""gradpress/kernels/cuda/randomk_draws.py under Numba's CUDA simulator: random-k's index
sets drawn on the GPU are Floyd's on the host, byte for byte, for one tensor and for a
tensor's partitions at once, with collision chains of up to 8 hops (k close to n), and the
kernels compile for a real GPU; indices computed ahead on the host go up in their place,
alone and for a tensor's partitions, with the same bytes. The simulator must be chosen before numba is imported, so
the cases run in a subprocess (cudasim_randomk_draws.py)."""
from pathlib import Path

import pytest
from cudasim_run import simulated_cases

SCRIPT = Path(__file__).with_name("cudasim_randomk_draws.py")


@pytest.mark.integ  # starts processes
@pytest.mark.timeout(400)
def test_gpu_draws_are_floyds_index_sets():
    results = {c["case"]: c for c in simulated_cases(SCRIPT, 360)}
    assert len([c for c in results if c.startswith("one-")]) == 11 and {"refused", "empty"} <= set(results)
    assert len([c for c in results if c.startswith("segments-")]) == 4 and "fewer-after-more" in results
    assert {"ahead/one", "ahead/segments-drawn", "ahead/segments-uploaded"} <= set(results)
    assert max(c.get("chain", 0) for c in results.values()) >= 4, "no case follows a chain of collisions back"
    failures = {name: c["problem"] for name, c in results.items() if c["problem"]}
    assert not failures, f"GPU draws and Floyd's disagree: {failures}"
