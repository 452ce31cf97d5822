"""What the folded momentum costs a step (``momentum: "nesterov"``, torch/folded_momentum.py):
the wrapped SGD's step over a model's uncompressed gradients of a folded group, with their
Nesterov momentum applied by ``FoldedMomentum`` (multi-tensor ops) and SGD's momentum 0,
against torch's own SGD with Nesterov momentum over the same tensors, in this process, on
one thread. 110 small tensors (biases, norms: 256 elements) and 50 of 4096.

    python benchmarks/folded_momentum.py [--reps 300] [--rounds 5]

No goal of its own: the step with folded momentum should cost about what torch's momentum
costs it. The last line is ``RESULT {json}`` (medians over rounds, ms a step).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from gradpress.compressors.policy import CompressionPolicy
from gradpress.pipeline import ParameterTable
from gradpress.torch.compression import Compression
from gradpress.torch.folded_momentum import FoldedMomentum
from results import emit as emit_result


class _Stepped(torch.optim.SGD):
    def __init__(self, params, folded):
        super().__init__(params, lr=0.1)
        self.folded = folded

    def step(self, closure=None):
        with self.folded.applied(self):
            return super().step(closure)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    shapes = [256] * 110 + [4096] * 50
    params = [torch.nn.Parameter(torch.zeros(n)) for n in shapes]
    coded = torch.nn.Parameter(torch.zeros(1 << 16))  # a codec's gradient: the group folds
    named = [(f"p{i}", p) for i, p in enumerate(params)] + [("coded", coded)]
    policy = CompressionPolicy({"compressor": "onebit", "momentum": "nesterov"}, min_bytes=1 << 17)
    table = ParameterTable([p for _, p in named], named, policy)
    folded = FoldedMomentum(table, Compression.none, route_of=lambda p: "direct")
    folded.fold([{"params": [p for _, p in named], "momentum": 0.9}], table.trainable)
    assert len(folded.raw) == len(params)
    mine = _Stepped(params, folded)
    refs = [torch.nn.Parameter(torch.zeros(n)) for n in shapes]
    torch_sgd = torch.optim.SGD(refs, lr=0.1, momentum=0.9, nesterov=True)
    for p, q in zip(params, refs):
        p.grad = torch.randn(p.shape)
        q.grad = p.grad.clone()

    def ms(step) -> float:
        for _ in range(20):
            step()
        start = time.perf_counter()
        for _ in range(args.reps):
            step()
        return (time.perf_counter() - start) / args.reps * 1e3

    folded_ms, torch_ms = [], []
    for _ in range(args.rounds):  # alternating, on a shared machine
        folded_ms.append(ms(mine.step))
        torch_ms.append(ms(torch_sgd.step))
    out = {"folded_ms": statistics.median(folded_ms), "torch_nesterov_ms": statistics.median(torch_ms)}
    out["ratio"] = out["folded_ms"] / out["torch_nesterov_ms"]
    print(f"SGD step over {len(params)} tensors: folded momentum {out['folded_ms']:.3f} ms, torch's Nesterov "
          f"momentum {out['torch_nesterov_ms']:.3f} ms ({out['ratio']:.2f}x)")
    emit_result("folded_momentum", {k: round(v, 4) for k, v in out.items()})


if __name__ == "__main__":
    main()
