"""CUDA kernels under Numba's simulator: payloads byte-identical to the CPU kernels, and
fused error feedback byte-identical to the generic steps on the device.

The simulator is chosen by NUMBA_ENABLE_CUDASIM=1 before numba is first imported, so the
comparison runs in a subprocess (cudasim_payloads.py) and this process stays unaffected.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compressors.cases import CODEC_PARAMS

pytestmark = pytest.mark.timeout(170 * 3 + 30)  # the simulator is slow; one run serves all
SCRIPT = Path(__file__).with_name("cudasim_payloads.py")
REPO = SCRIPT.parents[2]


@pytest.fixture(scope="module")
def results() -> dict:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, str(SCRIPT)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=170 * 3)
    assert run.returncode == 0, f"simulator run failed:\n{run.stderr[-4000:]}"
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return {line["case"]: line["problem"] for line in lines}


@pytest.mark.parametrize("group, minimum", [
    ("device-path-taken", 1), ("none/", 3), ("fp16/", 4), ("onebit", 12), ("topk", 8),
    ("randomk", 8), ("dither", 16), ("nan-rejected/", 4), ("error-feedback/", 3),
    ("decompress-to-device", 1),
    ("device-decode/", len(CODEC_PARAMS) * 6), ("device-decode-refused/", len(CODEC_PARAMS)),
    ("fused/", 12 * 2 * 2), ("fused-nan/", 12), ("topk-kernel/", 9), ("sparse-feedback/", 3),
    ("chunks/", 2), ("chunks-fused/", 3), ("payload-reused/", 3), ("pooled-payload-held", 1)])
def test_gpu_path_matches_cpu_kernels_byte_for_byte(results, group, minimum):
    cases = {case: problem for case, problem in results.items() if case.startswith(group)}
    assert len(cases) >= minimum, f"only {len(cases)} simulator cases for {group}"
    failures = {case: problem for case, problem in cases.items() if problem}
    assert not failures, f"GPU and CPU disagree: {failures}"
