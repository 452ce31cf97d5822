"""gradpress/kernels/cuda/rows.py under Numba's CUDA simulator: the GPU's row extraction is
byte-identical to the CPU kernels', with no row lost or reordered when every row is
non-zero (Zen's GPU insertion could lose them). The simulator must be chosen before
numba is imported, so the cases run in a subprocess (cudasim_rows.py)."""
from pathlib import Path

import pytest
from cudasim_run import simulated_cases

SCRIPT = Path(__file__).with_name("cudasim_rows.py")


@pytest.mark.integ  # starts processes
@pytest.mark.timeout(240)
def test_gpu_row_extraction_is_byte_identical_to_the_cpu_one():
    results = {c["case"]: c for c in simulated_cases(SCRIPT, 220)}
    assert set(results) == {"empty-table", "one-zero-row", "all-zero", "every-row", "block-edges", "random",
                            "fewer-after-more", "more-again"}
    assert results["every-row"]["rows"] == 300 and results["block-edges"]["rows"] == 5
    assert results["fewer-after-more"]["rows"] == 3 and results["more-again"]["rows"] > 200
    failures = {name: c["problem"] for name, c in results.items() if c["problem"]}
    assert not failures, f"GPU and CPU extraction disagree: {failures}"
