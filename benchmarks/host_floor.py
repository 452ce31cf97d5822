"""How fast can a compressed step be on this host? The floor under bandwidth.py's goals.

    flock /tmp/gp-cpu.lock .venv/bin/python benchmarks/host_floor.py [--models mlp,tfm]
        [--codecs onebit,randomk] [--iters N]

bandwidth.py's end-to-end goals compare a job's iteration with ``compute only``: one
training process alone on the machine. A job runs 2 workers and 2 servers on the same
2 cores. This measures what such a job cannot avoid, with no messages, sockets or server
processes at all: 2 worker processes at once, each running bandwidth_worker.py's loop
(same model, batch, SGD, one thread, freed memory kept as gradpress's workers keep it)
and, between backward and the optimizer step, the kernels a two-way compressed step
runs per element, through gradpress's own compressors:

- the worker's error feedback and compression of every gradient of at least
  BYTEPS_MIN_COMPRESS_BYTES (``gp_<codec>``'s compression_params);
- its share of the servers' work: for every other such key (the two processes split the
  keys, as two servers do), the two pushes decoded into the float32 sum (first written,
  second added; the process's own payload stands in for the other worker's) and the
  sum's error feedback and compression. randomk leaves this out: its servers add k
  values where they live (gradpress/server/values_sum.py), O(k);
- the pull decoded into the gradient, averaged.

Whatever a job adds to this (the communication thread's Python, ZeroMQ and encryption,
the servers' messages, waiting) comes on top, so ``floor / compute only`` is the least
ratio a job on this host can reach with that codec. The last line is ``RESULT {json}``
with ``<model>_compute_only_s_per_iter`` (bandwidth.py's), ``<model>_two_workers_s_per_iter``
(the loop alone in 2 processes at once) and ``<model>_<codec>_floor_s_per_iter`` (medians
over the processes' median iterations).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bandwidth import compute_only, python_env  # noqa: E402
from bandwidth_models import MODELS  # noqa: E402
from bandwidth_worker import GP_COMPRESSION, NUM_WORKERS  # noqa: E402
from bandwidth_worker import compute_only as compute_only_loop  # noqa: E402
from results import emit as emit_result  # noqa: E402

WARMUP = 3  # the first steps allocate the residuals and sums and fault their pages in
CODECS = ("onebit", "randomk")
SUMMED_WHERE_VALUES_LIVE = ("randomk",)


def worker_loop(model_name: str, codec: str, rank: int, iters: int) -> float:
    """Median seconds of one process's step: bandwidth_worker.py's loop, with ``codec``'s
    per-element work between backward and the optimizer step."""
    import numpy as np

    from gradpress.compressors.registry import build_compressor
    from gradpress.config import Settings

    if codec == "none":
        return compute_only_loop(model_name, iters, True, rank=rank, warmup=WARMUP)
    min_elements = Settings.load().min_compress_bytes // 4
    params = GP_COMPRESSION[f"gp_{codec}"]
    worker, server = build_compressor(params, "worker"), build_compressor(params, "server")
    sums: dict[int, np.ndarray] = {}  # key -> the float32 sum this process serves

    def round_trip(model_params: list, step: int) -> None:
        compressed = [p for p in model_params if p.numel() >= min_elements]
        for key, p in enumerate(compressed):
            g = p.grad.numpy().reshape(-1)
            header, buffers = worker.compress(g, key, step)
            if key % NUM_WORKERS == rank and codec not in SUMMED_WHERE_VALUES_LIVE:
                acc = sums.setdefault(key, np.empty(g.size, np.float32))
                server.decompress(header, buffers, acc, key, step)
                server.decompress_add(header, buffers, acc, key, step)
                header, buffers = server.compress(acc, key, step)
            worker.decompress(header, buffers, g, key, step, NUM_WORKERS)

    return compute_only_loop(model_name, iters, True, rank=rank, warmup=WARMUP, after_backward=round_trip)


def two_workers(model: str, codec: str, iters: int) -> list[float]:
    """Each of ``NUM_WORKERS`` processes' median step, run at once."""
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"rank{r}" for r in range(NUM_WORKERS)]
        procs = [subprocess.Popen([sys.executable, __file__, "_worker", model, codec, str(r), str(iters), str(out)],
                                  env=python_env()) for r, out in enumerate(outs)]
        deadline = time.monotonic() + 600
        for proc in procs:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise SystemExit(f"host_floor.py: {model} {codec} did not finish in 600 s")
            if proc.returncode:
                raise SystemExit(f"host_floor.py: a {model} {codec} process exited with {proc.returncode}")
        return [float(out.read_text()) for out in outs]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mlp,tfm")
    parser.add_argument("--codecs", default=",".join(CODECS))
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    models, codecs = args.models.split(","), args.codecs.split(",")
    for name in models:
        if name not in MODELS:
            parser.error(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    for codec in codecs:
        if f"gp_{codec}" not in GP_COMPRESSION or codec not in CODECS:
            parser.error(f"unknown codec {codec!r}; known: {', '.join(CODECS)}")
    result = {}
    floors, _ = compute_only(models, "first")
    for model in models:
        result[f"{model}_compute_only_s_per_iter"] = round(floors[model], 4)
        for codec in ["none", *codecs]:
            steps = two_workers(model, codec, args.iters)
            s = statistics.median(steps)
            what = "two_workers" if codec == "none" else f"{codec}_floor"
            result[f"{model}_{what}_s_per_iter"] = round(s, 4)
            print(f"{model} {what}: {' '.join(f'{t:.4f}' for t in steps)} s/iter per process; "
                  f"{s / floors[model]:.2f}x compute only", flush=True)
    emit_result("host_floor", result)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_worker"]:
        model, codec, rank, iters, out = sys.argv[2:7]
        Path(out).write_text(str(worker_loop(model, codec, int(rank), int(iters))))
    else:
        sys.exit(main())
