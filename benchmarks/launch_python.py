"""Python a GPU worker pays per launch and per landing, timed on any machine (no GPU needed):

- numba's low-occupancy warning: building the launch configuration of a 4-block grid
  (``kernel[4, 128]``) with numba's warning on (its default: a warning built at every launch
  of under 128 blocks) and off (a GPU worker's default, ``kernels/cuda/device.py``);
- a landing's torch view of a read-only pulled result (4,096 float32): inside
  ``warnings.catch_warnings`` as every landing did before, and as now, bare (torch warns
  about read-only arrays once per process; the first one is caught).

    python benchmarks/launch_python.py [--calls 20000]

Each figure is the best of 5 repeats of ``--calls`` calls, in microseconds a call, the two
ways of each alternating in one process. The last line is ``RESULT {json}``.
"""
from __future__ import annotations

import argparse
import os
import sys
import timeit
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from results import emit  # noqa: E402


def per_call_us(fn, calls: int) -> float:
    return min(timeit.repeat(fn, number=calls, repeat=5)) / calls * 1e6


def launch_configuration(calls: int) -> dict:
    from numba.core import config
    from numba.cuda.dispatcher import _LaunchConfiguration
    was = config.CUDA_LOW_OCCUPANCY_WARNINGS
    out = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")  # Python's own: shown once, then looked up each time
            for flag, label in ((1, "on"), (0, "off"), (1, "on"), (0, "off")):
                config.CUDA_LOW_OCCUPANCY_WARNINGS = flag
                us = per_call_us(lambda: _LaunchConfiguration(None, (4, 1, 1), (128, 1, 1), 0, 0), calls)
                out[f"small_grid_warning_{label}_us"] = min(us, out.get(f"small_grid_warning_{label}_us", us))
    finally:
        config.CUDA_LOW_OCCUPANCY_WARNINGS = was
    return out


def read_only_view(calls: int) -> dict:
    import numpy as np
    import torch
    host = np.frombuffer(bytes(4096 * 4), np.float32)  # read-only, as ZeroMQ's frames are

    def caught():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            torch.from_numpy(host)

    caught()  # torch's one warning, out of the way
    out = {}
    for fn, label in ((caught, "caught"), (lambda: torch.from_numpy(host), "bare")) * 2:
        us = per_call_us(fn, calls)
        out[f"read_only_view_{label}_us"] = min(us, out.get(f"read_only_view_{label}_us", us))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    result = {**launch_configuration(args.calls), **read_only_view(args.calls)}
    result["small_grid_warning_cost_us"] = result["small_grid_warning_on_us"] - result["small_grid_warning_off_us"]
    result["catch_warnings_cost_us"] = result["read_only_view_caught_us"] - result["read_only_view_bare_us"]
    for key, value in result.items():
        print(f"{key:>32}  {value:.2f}")
    emit("launch_python", {k: round(v, 3) for k, v in result.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
