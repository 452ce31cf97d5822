"""A low-rank reducer's whole step on this host, without the network: ``LowRankReducer.reduce``
with a job of one worker whose sums return at once (what the step's thread does around the
sums: the products, Gram-Schmidt, the error update, reconstruction and its bookkeeping).

    flock /tmp/gp-cpu.lock .venv/bin/python benchmarks/lowrank_step.py

24 matrices (12 of 512 x 512, 6 of 2048 x 512, 6 of 512 x 2048) at rank 4, PowerSGD and
ACP-SGD; the median of 20 steps after 5 (``results.emit``: seconds a step). To
compare two trees, run it in each in turn (``PYTHONPATH`` set to the tree).
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch
from results import emit

from gradpress.compressors.lowrank import LowRankParams
from gradpress.pipeline.lowrank import LowRankReducer

SHAPES = [(512, 512)] * 12 + [(2048, 512)] * 6 + [(512, 2048)] * 6


class OneWorker:
    """A job of one worker: a push_pull's sum is the tensor itself, at once."""

    def start(self, tensor, name, *, priority=0, spec=None, lr=None, average=True):
        return tensor

    def wait(self, handle):
        return handle

    def size(self):
        return 1

    def rank(self):
        return 0

    def span(self, name, **args):
        return contextlib.nullcontext()


def step_seconds(method: str, steps: int = 25, warm: int = 5) -> float:
    torch.manual_seed(0)
    tensors = [torch.zeros(s) for s in SHAPES]
    reducer = LowRankReducer([(f"m{i}", t) for i, t in enumerate(tensors)], LowRankParams(method, 4, 0, 2.0, 0),
                             "bench.", comm=OneWorker())
    grads = [torch.randn(s) for s in SHAPES]
    times = []
    for _ in range(steps):
        given = {id(t): g.clone() for t, g in zip(tensors, grads)}
        start = time.perf_counter()
        reducer.reduce(given)
        times.append(time.perf_counter() - start)
    return statistics.median(times[warm:])


if __name__ == "__main__":
    torch.set_num_threads(1)
    emit("lowrank_step", {f"{method}_step_s": round(step_seconds(method), 5) for method in ("powersgd", "acpsgd")})
