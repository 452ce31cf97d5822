"""CUDA kernels under Numba's simulator: payloads byte-identical to the CPU kernels, and
fused error feedback byte-identical to the generic steps on the device.

The simulator is chosen by NUMBA_ENABLE_CUDASIM=1 before numba is first imported, so the
comparison runs in a subprocess (cudasim_payloads.py) and this process stays unaffected.
"""
from pathlib import Path

import pytest
from cudasim_run import simulated_cases

from compressors.cases import CODEC_PARAMS

pytestmark = pytest.mark.timeout(170 * 3 + 30)  # the simulator is slow; one run serves all
SCRIPT = Path(__file__).with_name("cudasim_payloads.py")


@pytest.fixture(scope="module")
def results() -> dict:
    return {line["case"]: line["problem"] for line in simulated_cases(SCRIPT, 170 * 3)}


@pytest.mark.parametrize("group, minimum", [
    ("device-path-taken", 1), ("none/", 3), ("fp16/", 4), ("onebit", 12), ("topk", 8),
    ("randomk", 8), ("dither", 16), ("nan-rejected/", 12), ("error-feedback/", 6),
    ("compensate-checked", 1), ("add-scaled", 1),
    ("decompress-to-device", 1), ("raw-fallback/", 2),
    ("device-decode/", len(CODEC_PARAMS) * 6), ("device-decode-refused/", len(CODEC_PARAMS)),
    ("fused/", 12 * 3), ("fused-nan/", 16), ("topk-kernel/", 9), ("sparse-feedback/", 3),
    ("chunks/", 2), ("chunks-fused/", 1), ("payload-reused/", 3), ("pooled-payload-held", 1)])
def test_gpu_path_matches_cpu_kernels_byte_for_byte(results, group, minimum):
    cases = {case: problem for case, problem in results.items() if case.startswith(group)}
    assert len(cases) >= minimum, f"only {len(cases)} simulator cases for {group}"
    failures = {case: problem for case, problem in cases.items() if problem}
    assert not failures, f"GPU and CPU disagree: {failures}"
