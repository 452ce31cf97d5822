"""Running a test script under Numba's CUDA simulator: NUMBA_ENABLE_CUDASIM=1 must be set
before numba is first imported, so each script runs in a subprocess of its own, printing
one JSON object per case; the test process itself stays on the real (or no) GPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]


def simulated_cases(script: Path, timeout_s: float) -> list[dict]:
    """The JSON lines ``script`` printed under the simulator; fails the test where it exited
    with an error (its stderr's end in the message)."""
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=timeout_s)
    assert run.returncode == 0, f"simulator run failed:\n{run.stderr[-4000:]}"
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
