"""What PowerSGD's and ACP-SGD's worker-side steps cost here: Numba kernels against torch ops.

    flock /tmp/gp-cpu.lock .venv/bin/python benchmarks/lowrank_kernels.py [--reps 7]
    python benchmarks/lowrank_kernels.py --device cuda    # the torch columns on a GPU

On a GPU (``--device cuda``) only the torch columns run, timed to the device's end of each
call (a synchronize), and the record is ``lowrank_kernels_gpu``.

One thread (as every benchmark worker runs). Matrices: the bandwidth benchmark's MLP (3
matrices, 25.2M elements) and a transformer's (8 blocks of width 512: 33 matrices).

- orthonormalise: every matrix's factor of one step, Numba (modified Gram-Schmidt over the
  flat buffer, one call) against torch (``torch.linalg.qr`` per matrix, and the same
  Gram-Schmidt as torch ops on batches of matrices, what a GPU worker runs), with the torch
  ops each dispatches that are not views (Gram-Schmidt's as a GPU batches them): on a GPU
  each is a launch and its host cost;
- a step's compression arithmetic without communication (M + E, products, error update,
  reconstruction), Numba (``NumbaMath``) against torch (``TorchMath``): ACP-SGD's P step and
  Q step, and PowerSGD's two rounds.

Prints medians in milliseconds and a last line ``RESULT {json}``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gradpress.pipeline import lowrank_math  # noqa: E402
from gradpress.pipeline.lowrank_math import NumbaMath, TorchMath  # noqa: E402
from gradpress.testing.torch_ops import median_ms, ops_of  # noqa: E402
from results import emit as emit_result  # noqa: E402

SHAPES = {
    "mlp": [(4096, 1024), (4096, 4096), (1024, 4096)],
    "tfm": [(256, 512)] + [(1536, 512), (512, 512), (2048, 512), (512, 2048)] * 8,
}


def orth_costs(shapes, rank: int, reps: int, device: str) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    ranks = [min(rank, n, m) for n, m in shapes]
    sizes = [n * r for (n, _), r in zip(shapes, ranks)]
    flat0 = torch.randn(sum(sizes), generator=g).to(device)
    offsets = np.cumsum([0] + sizes[:-1]).astype(np.int64)
    layout = (offsets, np.array([n for n, _ in shapes], np.int64), np.array(ranks, np.int64))
    flat = flat0.clone()

    def numba():
        flat.copy_(flat0)
        NumbaMath.orthonormalize(flat, layout, False)

    def torch_gs():
        flat.copy_(flat0)
        TorchMath.orthonormalize(flat, layout, False)

    def torch_qr():
        flat.copy_(flat0)
        for off, (n, _), r in zip(offsets, shapes, ranks):
            block = flat[int(off):int(off) + n * r].view(n, r)
            block.copy_(torch.linalg.qr(block).Q)
    out = {"numba_batched": median_ms(numba, reps)} if device == "cpu" else {}
    out.update(torch_gram_schmidt=median_ms(torch_gs, reps), torch_qr=median_ms(torch_qr, reps),
               torch_qr_ops=ops_of(torch_qr))
    # the ops as a GPU worker batches them (one batch where padding fits: on a host the
    # timing above pads less, by powers of two)
    on_host = lowrank_math.PAD_BUDGET.pop("cpu")
    try:
        out["torch_gram_schmidt_ops"] = ops_of(torch_gs)
    finally:
        lowrank_math.PAD_BUDGET["cpu"] = on_host
    return out


def step_costs(shapes, rank: int, reps: int, device: str) -> dict[str, float]:
    g = torch.Generator().manual_seed(1)
    mats = []
    for n, m in shapes:
        r = min(rank, n, m)
        mats.append(tuple(t.to(device) for t in (
            torch.randn(n, m, generator=g), torch.zeros(n, m), torch.randn(n, r, generator=g),
            torch.randn(r, m, generator=g), torch.empty(n, m))))
    out = {}
    grads, es, ps, qts, outs = (list(column) for column in zip(*mats))
    for math in (NumbaMath, TorchMath) if device == "cpu" else (TorchMath,):
        def acp_p():
            math.factor_rows(grads, es, qts, ps, True, True)
            math.reconstruct(ps, qts, 0.5, outs)

        def acp_q():
            math.factor_cols_subtract(grads, es, ps, qts, True)
            math.reconstruct(ps, qts, 0.5, outs)

        def powersgd():
            math.factor_rows(grads, es, qts, ps, True, False)
            math.factor_cols_subtract(None, es, ps, qts, False)
            math.reconstruct(ps, qts, 0.5, outs)
        name = "numba" if math is NumbaMath else "torch"
        for what, fn in (("acpsgd_p_step", acp_p), ("acpsgd_q_step", acp_q), ("powersgd_step", powersgd)):
            for e in es:
                e.zero_()
            out[f"{what}_{name}"] = median_ms(fn, reps)
            if math is TorchMath:
                out[f"{what}_torch_ops"] = ops_of(fn)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: the torch columns on the GPU")
    args = ap.parse_args()
    if args.device != "cpu" and not torch.cuda.is_available():
        print(f"--device {args.device}: torch sees no GPU here; nothing measured")
        return 2
    torch.set_num_threads(1)
    result = {}
    for model, shapes in SHAPES.items():
        elements = sum(n * m for n, m in shapes)
        for rank in (1, 4):
            costs = {**orth_costs(shapes, rank, args.reps, args.device),
                     **step_costs(shapes, rank, args.reps, args.device)}
            print(f"{model} ({len(shapes)} matrices, {elements / 1e6:.1f}M elements), rank {rank}: "
                  + ", ".join(f"{k} {v}" if k.endswith("_ops") else f"{k} {v:.2f} ms" for k, v in costs.items()),
                  flush=True)
            result.update({f"{model}_r{rank}_{k}" if k.endswith("_ops") else f"{model}_r{rank}_{k}_ms": round(v, 3)
                           for k, v in costs.items()})
    if args.device != "cpu":
        result["device"] = torch.cuda.get_device_name()
    emit_result("lowrank_kernels" if args.device == "cpu" else "lowrank_kernels_gpu", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
