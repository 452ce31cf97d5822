"""What OneBitAdam's and ZeroOneAdam's arithmetic costs a step: multi-tensor ops against one
tensor at a time.

    flock /tmp/gp-cpu.lock .venv/bin/python benchmarks/adam_ops.py [--reps 9]
    python benchmarks/adam_ops.py --device cuda    # on a GPU: record adam_ops_gpu

The bandwidth benchmark's transformer (102 tensors, 33.6M parameters), one parameter group,
weight decay on. Each step kind's arithmetic without its push_pull (the average is the
worker's own tensor):
- OneBitAdam frozen: the momentum sent, the average copied into m, the denominators, the update;
- ZeroOneAdam momentum step: the same with the variance floor, at every step;
- ZeroOneAdam local step: m updated with the gradient, the floored denominators, the update.

``multi`` runs ``optim/adam_math`` over the whole list (what the optimizers run);
``per tensor`` runs the same functions on one tensor at a time, the ops the optimizers ran
before, with the same bits. Columns: torch ops dispatched that are not views (on a GPU, a
launch each) and
milliseconds, medians, one thread; on a GPU each call timed to the device's end.
Prints a last line ``RESULT {json}``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bandwidth_models  # noqa: E402
from gradpress.optim import adam_math  # noqa: E402
from gradpress.testing.torch_ops import median_ms, ops_of  # noqa: E402
from results import emit as emit_result  # noqa: E402

B1, B2, EPS, LR, WD, FLOOR, T = 0.9, 0.999, 1e-8, 1e-3, 0.01, 0.1, 20


def steps(ps, ms, vs, gs) -> dict:
    """Each step kind's arithmetic over the lists given."""
    bias1, bias2 = 1 - B1 ** T, 1 - B2 ** T
    n = len(ps)

    def onebit_frozen():
        sent = adam_math.momenta(ms, gs, B1)
        torch._foreach_copy_(ms, sent)
        adam_math.apply(ps, ms, adam_math.denominators(vs, [None] * n, EPS), [bias1] * n, LR, WD)

    def zero_one_momentum():
        sent = adam_math.momenta(ms, gs, B1)
        torch._foreach_copy_(ms, sent)
        adam_math.apply(ps, ms, adam_math.denominators(vs, [bias2] * n, EPS, FLOOR), [bias1] * n, LR, WD)

    def zero_one_local():
        adam_math.accumulate(ms, None, gs, B1, 0.0)
        adam_math.apply(ps, ms, adam_math.denominators(vs, [bias2] * n, EPS, FLOOR), [bias1] * n, LR, WD)

    return {"onebit_frozen": onebit_frozen, "zero_one_momentum": zero_one_momentum,
            "zero_one_local": zero_one_local}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda")
    args = ap.parse_args()
    if args.device != "cpu" and not torch.cuda.is_available():
        print(f"--device {args.device}: torch sees no GPU here; nothing measured")
        return 2
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with torch.no_grad():
        ps = [p.detach().to(args.device) for p in bandwidth_models.build_tfm().parameters()]
        ms, gs = [torch.randn_like(p) * 1e-3 for p in ps], [torch.randn_like(p) * 1e-3 for p in ps]
        vs = [torch.rand_like(p) * 1e-6 for p in ps]
        multi = steps(ps, ms, vs, gs)
        singles = [steps([p], [m], [v], [g]) for p, m, v, g in zip(ps, ms, vs, gs)]
        result = {"tensors": len(ps), "elements": sum(p.numel() for p in ps)}
        for kind in multi:
            def one_at_a_time(kind=kind):
                for s in singles:
                    s[kind]()
            for way, fn in (("multi", multi[kind]), ("per_tensor", one_at_a_time)):
                result[f"{kind}_{way}_ops"] = ops_of(fn)
                result[f"{kind}_{way}_ms"] = round(median_ms(fn, args.reps), 3)
            print(f"{kind}: multi {result[f'{kind}_multi_ops']} ops {result[f'{kind}_multi_ms']:.2f} ms, "
                  f"per tensor {result[f'{kind}_per_tensor_ops']} ops {result[f'{kind}_per_tensor_ms']:.2f} ms",
                  flush=True)
    if args.device != "cpu":
        result["device"] = torch.cuda.get_device_name()
    emit_result("adam_ops" if args.device == "cpu" else "adam_ops_gpu", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
