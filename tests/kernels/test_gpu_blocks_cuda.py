"""The kernels whose blocks Numba's CUDA simulator shrinks, run in it at the GPU's block
sizes (tests/support/gpu_block_sizes.py) over several blocks: payloads, fused error
feedback and the one-block pairing byte-identical to the CPU kernels. The simulator must be
chosen before numba is imported, so the cases run in a subprocess (cudasim_gpu_blocks.py)."""
from pathlib import Path

import pytest
from cudasim_run import assert_case_groups

SCRIPT = Path(__file__).with_name("cudasim_gpu_blocks.py")


@pytest.mark.integ  # starts processes
@pytest.mark.timeout(300)
def test_the_kernels_at_the_gpus_block_sizes_match_the_cpu_kernels():
    groups = {"gpu-sizes": 1, "codec/onebit": 3, "codec/topk": 2, "codec/dither": 4, "fused/": 2, "partitions/": 2,
              "totals/": 4}
    assert_case_groups(SCRIPT, 280, groups, "GPU-sized kernels and CPU kernels")
