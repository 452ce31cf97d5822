"""The kernels whose blocks Numba's CUDA simulator shrinks, run in it at the GPU's block
sizes (tests/support/gpu_block_sizes.py) over several blocks: payloads, fused error
feedback and the one-block pairing byte-identical to the CPU kernels. The simulator must be
chosen before numba is imported, so the cases run in a subprocess (cudasim_gpu_blocks.py)."""
from pathlib import Path

import pytest
from cudasim_run import simulated_cases

SCRIPT = Path(__file__).with_name("cudasim_gpu_blocks.py")


@pytest.mark.integ  # starts processes
@pytest.mark.timeout(300)
def test_the_kernels_at_the_gpus_block_sizes_match_the_cpu_kernels():
    results = {c["case"]: c["problem"] for c in simulated_cases(SCRIPT, 280)}
    groups = {"gpu-sizes": 1, "codec/onebit": 3, "codec/topk": 2, "codec/dither": 4, "fused/": 2, "partitions/": 2,
              "totals/": 4}
    for group, count in groups.items():
        assert len([c for c in results if c.startswith(group)]) == count, f"{group}: {sorted(results)}"
    failures = {case: problem for case, problem in results.items() if problem}
    assert not failures, f"GPU-sized kernels and CPU kernels disagree: {failures}"
