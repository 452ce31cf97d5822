"""What a GPU worker's device plumbing does to Python's warnings (gradpress/kernels/cuda/device.py):
numba's low-occupancy warning is off for gradpress's deliberately small grids unless the user
asks for it, and landing a read-only pulled result catches torch's one warning about it once,
not at every landing (catch_warnings swaps the process's filters beside other threads).
Each case runs in a fresh process: both numba's setting and torch's warning are per process."""
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integ  # each case starts a process

SMALL_GRID = """
import warnings
import gradpress.kernels.cuda.device  # noqa: F401
from numba.cuda.dispatcher import _LaunchConfiguration  # what a launch of kernel[4, 128] builds
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    _LaunchConfiguration(None, (4, 1, 1), (128, 1, 1), 0, 0)
print(len(seen), *[str(w.message) for w in seen])
"""

LANDINGS = """
import warnings
warnings.simplefilter("error")  # a warning that escapes fails the landing
import numpy as np, torch
from gradpress.kernels.cuda import device
entered = []
class Counted(warnings.catch_warnings):
    def __enter__(self):
        entered.append(1)
        return super().__enter__()
warnings.catch_warnings = Counted
out = torch.empty(8)
for step in range(3):  # a read-only frame, as ZeroMQ hands pulled results over
    host = np.frombuffer((np.arange(8, dtype=np.float32) * (step + 1)).tobytes(), np.float32)
    assert not host.flags.writeable
    device.land_divided(host, out, 2)
    assert torch.equal(out, torch.arange(8.0) * (step + 1) / 2), out
print(len(entered))
"""


def _run(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, env={**environ, **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.mark.timeout(150)
def test_numbas_small_grid_warning_is_off_unless_the_user_turns_it_on():
    assert _run(SMALL_GRID) == "0"
    assert _run(SMALL_GRID, NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS="1") == \
        "1 Grid size 4 will likely result in GPU under-utilization due to low occupancy."


@pytest.mark.timeout(150)
def test_read_only_results_land_with_torchs_warning_caught_once_not_at_every_landing():
    assert _run(LANDINGS) == "1"
