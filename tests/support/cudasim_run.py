"""Running a test script under Numba's CUDA simulator: NUMBA_ENABLE_CUDASIM=1 must be set
before numba is first imported, so each script runs in a subprocess of its own, printing
one JSON object per case; the test process itself stays on the real (or no) GPU.

The simulator runs a kernel's Python untyped, so every kernel the script launched is then
compiled for a real GPU with the argument types it was launched with (``ptx_check.py``):
a kernel numba's CUDA compiler refuses fails the test here, not on the first GPU."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import kernel_signatures

REPO = Path(__file__).parents[2]
# numba-cuda and NVIDIA's compiler libraries (``make setup``; ptx_check.py says why apart)
COMPILER = Path(os.environ.get("GRADPRESS_CUDA_COMPILER", REPO / ".venv" / "cuda-compiler"))
PTX_CHECK = Path(__file__).with_name("ptx_check.py")
PTX_TIMEOUT_S = 300


def simulated_cases(script: Path, timeout_s: float) -> list[dict]:
    """The JSON lines ``script`` printed under the simulator; fails the test where it exited
    with an error (its stderr's end in the message), or where a kernel it launched does not
    compile for a GPU."""
    with tempfile.TemporaryDirectory() as tmp:
        signatures = Path(tmp) / "signatures.pickle"
        env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(REPO),
               kernel_signatures.ENV: str(signatures)}
        run = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=timeout_s)
        assert run.returncode == 0, f"simulator run failed:\n{run.stderr[-4000:]}"
        assert signatures.exists(), f"{script.name} recorded no kernel launch (kernel_signatures.record())"
        _assert_compiled(signatures)
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


def _assert_compiled(signatures: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["GRADPRESS_CUDA_COMPILER"] = str(COMPILER)
    libraries = COMPILER / "nvidia" / "cu13" / "lib"
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(libraries), env.get("LD_LIBRARY_PATH")]))
    run = subprocess.run([sys.executable, str(PTX_CHECK), str(signatures)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=PTX_TIMEOUT_S)
    assert run.returncode == 0, f"compiling the kernels for a GPU failed:\n{run.stderr[-4000:]}"
    compiled = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert compiled, "no kernel was compiled for a GPU"
    refused = {c["case"]: c["problem"] for c in compiled if c["problem"]}
    assert not refused, f"kernels numba's CUDA compiler refuses (the simulator does not type them): {refused}"


def assert_case_groups(script: Path, timeout_s: float, groups: dict, what: str) -> None:
    """Run ``script`` (``simulated_cases``); each group (a case-name prefix) must have its
    count of cases, and no case a problem (``what`` disagree, naming them)."""
    results = {c["case"]: c["problem"] for c in simulated_cases(script, timeout_s)}
    for group, count in groups.items():
        assert len([c for c in results if c.startswith(group)]) == count, f"{group}: {sorted(results)}"
    failures = {case: problem for case, problem in results.items() if problem}
    assert not failures, f"{what} disagree: {failures}"
