"""Where a dense gradient's non-zero rows are worth sending as rows: push_pull time of a
rows x width float32 gradient sent dense against sent as its non-zero rows, by density.

    flock /tmp/gp-cpu.lock .venv/bin/python benchmarks/sparse_density.py [--rows 100000] [--width 64]
        [--densities 0.01,0.05,0.1,0.2,0.3,0.5,0.7] [--repeats 5]

Runs a local job (2 workers, 1 server, TCP over loopback: GRADPRESS_SHM=0). Loopback moves
bytes at memory speed, so this is where the row path's extra CPU work (finding, sorting,
merging rows) weighs most against the bytes it saves: a density at which rows win here
wins on any slower link too. Each worker touches its own random rows (the union of two
workers is about twice as dense as each). Time: median over ``repeats`` of the worker's
push_pull (start to result), after one warm-up of each. The last line is ``RESULT {json}``
with, per density, dense and rows seconds and their ratio, and ``break_even_density``:
the highest density measured at which rows were still faster.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results import child_env
from results import emit as emit_result

HERE = Path(__file__).resolve().parent


def worker(a: argparse.Namespace) -> None:
    import numpy as np
    import torch
    import gradpress.torch as bps
    from gradpress.torch import ops
    torch.set_num_threads(1)
    bps.init()
    rng = np.random.default_rng(bps.rank())
    results = {}
    for d in a.densities:
        g = torch.zeros(a.rows, a.width)
        rows = rng.choice(a.rows, int(d * a.rows), replace=False)
        g[torch.from_numpy(rows)] = torch.randn(rows.size, a.width)
        times = {"dense": [], "rows": []}
        for k in range(a.repeats + 1):
            for how in ("dense", "rows"):
                x = g.clone()
                t = time.perf_counter()
                if how == "dense":
                    bps.synchronize(bps.push_pull_async_inplace(x, average=False, name=f"dense.{d}"))
                else:
                    bps.synchronize(ops.push_pull_rows_async_inplace(x, average=False, name=f"rows.{d}"))
                if k:
                    times[how].append(time.perf_counter() - t)
        results[d] = {how: statistics.median(ts) for how, ts in times.items()}
        if bps.rank() == 0:
            r = results[d]
            print(f"density {d:5.2f}: dense {r['dense'] * 1e3:8.1f} ms, rows {r['rows'] * 1e3:8.1f} ms, "
                  f"rows/dense {r['rows'] / r['dense']:.2f}", flush=True)
    if bps.rank() == 0:
        faster = [d for d, r in results.items() if r["rows"] < r["dense"]]
        out = {"rows": a.rows, "width": a.width, "workers": 2, "servers": 1, "link": "loopback TCP",
               "per_density": {str(d): {k: round(v, 5) for k, v in r.items()} for d, r in results.items()},
               "break_even_density": max(faster) if faster else None}
        emit_result("sparse_density", out)
    bps.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--densities", default="0.01,0.05,0.1,0.2,0.3,0.5,0.7")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    a.densities = [float(x) for x in a.densities.split(",")]
    if a._worker:
        worker(a)
        return 0
    env = {**os.environ, "GRADPRESS_SHM": "0", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": str(HERE.parent), **child_env()}  # rank 0 reports this command's result
    argv = [str(Path(sys.executable).parent / "gradpress-launch"), "--local", "--workers", "2", "--servers", "1",
            "--", sys.executable, str(Path(__file__).resolve()), "--_worker", "--rows", str(a.rows), "--width",
            str(a.width), "--densities", ",".join(map(str, a.densities)), "--repeats", str(a.repeats)]
    return subprocess.run(argv, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
