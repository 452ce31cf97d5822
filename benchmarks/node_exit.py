"""What Python's final garbage collections cost a short job: the same job (2 workers, 1
server, ``gradpress-launch --local``; each worker trains a small MLP for 6 steps with
``torch.optim.SGD`` under ``DistributedOptimizer``) with ``GRADPRESS_EXIT_SKIP_GC=1`` (the
default) and ``=0`` in turn, the job's CPU-seconds (every process it started, from the
operating system's accounting of finished children) and its wall time.

    python benchmarks/node_exit.py [--reps 5]

Goal: the job's CPU with the collections skipped at most 0.85x the job's with them. The
last line is ``RESULT {json}`` (medians of each, the ratio and the CPU-seconds saved).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from results import emit as emit_result

WORKERS = 2
WORKER = """
import torch, gradpress.torch as bps
bps.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                               named_parameters=model.named_parameters())
for step in range(6):
    opt.zero_grad()
    x = torch.randn(16, 32)
    torch.nn.functional.cross_entropy(model(x), torch.randint(0, 4, (16,))).backward()
    opt.step()
bps.shutdown()
"""


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def job(script: str, skip: str) -> tuple[float, float]:
    """(CPU-seconds, wall seconds) of one job."""
    launcher = os.path.join(os.path.dirname(sys.executable), "gradpress-launch")
    env = {**os.environ, "GRADPRESS_EXIT_SKIP_GC": skip, "OMP_NUM_THREADS": "1"}
    cpu, wall = children_cpu(), time.perf_counter()
    run = subprocess.run([launcher, "--local", "--workers", str(WORKERS), "--servers", "1", "--",
                          sys.executable, script], env=env, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise SystemExit(f"the job failed (GRADPRESS_EXIT_SKIP_GC={skip}):\n{run.stdout[-3000:]}{run.stderr[-3000:]}")
    return children_cpu() - cpu, time.perf_counter() - wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as fh:
            fh.write(WORKER)
        job(script, "1")  # numba's cache and the page cache warm for both
        runs: dict[str, list[tuple[float, float]]] = {"skip": [], "collect": []}
        for _ in range(args.reps):  # alternating, so that the host's drift slows both alike
            for label, skip in (("skip", "1"), ("collect", "0")):
                runs[label].append(job(script, skip))
    cpu = {k: statistics.median(c for c, _ in v) for k, v in runs.items()}
    wall = {k: statistics.median(w for _, w in v) for k, v in runs.items()}
    result = {"job_cpu_s": cpu, "job_wall_s": wall, "workers": WORKERS, "reps": args.reps,
              "saved_cpu_s": cpu["collect"] - cpu["skip"],
              "cpu_ratio": cpu["skip"] / cpu["collect"]}
    for k in ("skip", "collect"):
        print(f"{k:8s} job CPU {cpu[k]:6.2f} s   wall {wall[k]:5.2f} s")
    print(f"job CPU ratio {result['cpu_ratio']:.2f} (goal <= 0.85); saved {result['saved_cpu_s']:.2f} CPU-s "
          f"({WORKERS} workers, a server and the scheduler)")
    emit_result("node_exit", result)


if __name__ == "__main__":
    main()
