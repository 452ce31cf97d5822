"""What a fused group costs the training thread around its push_pull, for the transformer
of ``bandwidth.py`` fused into one bucket (102 gradients, 33.6M floats): a ``Bucket``'s
submits and ``finish`` (``gradpress/pipeline/routes/bucket.py``) with the push_pull replaced
by nothing, the averages landing as DistributedOptimizer lands them (views), when
every gradient is new (``zero_grad()``'s default: copied in, handed back as views) and
when every gradient is still in its view (``zero_grad(set_to_none=False)``: no copy at
all); next to them, a copy of the average back into each gradient's own memory, as
``finish`` did before the views.

    python benchmarks/fused_copies.py [--reps N]

The last line is ``RESULT {json}`` (milliseconds, medians of N).
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

from bandwidth_models import MODELS  # noqa: E402

from gradpress.pipeline.routes.bucket import Bucket  # noqa: E402
from results import emit as emit_result  # noqa: E402


class NoJob:
    """A push_pull that does nothing: the handle is the tensor."""
    def start(self, tensor, name, **kwargs):
        return tensor

    def wait(self, handle):
        return handle


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    params = list(MODELS["tfm"].build().parameters())
    fresh = [torch.randn_like(p) for p in params]
    group = Bucket("tfm", params, None, 0, NoJob(), views=True)  # as DistributedOptimizer's

    def new_gradients():
        for p, g in zip(params, fresh):
            p.grad = g

    def round_trip():
        for p in params:
            group.submit(p, p.grad)
        out = group.finish()
        for p in params:  # as DistributedOptimizer lands them: the views become the gradients
            p.grad = out[id(p)]

    def copy_back():  # what finish did before: the average into each gradient's own memory
        flat, offset = group.buffer.numpy(), 0
        for g in fresh:
            view = g.numpy()
            np.copyto(view, flat[offset:offset + view.size].reshape(view.shape))
            offset += view.size

    def timed(setup, run) -> float:
        times = []
        for _ in range(args.reps):
            setup()
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
        return 1e3 * statistics.median(times)

    new_gradients()
    round_trip()  # allocates the buffer
    result = {
        "tfm_fused_new_gradients_ms": timed(new_gradients, round_trip),
        "tfm_fused_gradients_in_views_ms": timed(lambda: None, round_trip),
        "tfm_copy_back_ms": timed(lambda: None, copy_back),
    }
    n = sum(p.numel() for p in params)
    print(f"transformer, {len(params)} gradients, {n / 1e6:.1f}M floats in one group, medians of {args.reps}:")
    print(f"  new gradients (copied in, handed back as views): {result['tfm_fused_new_gradients_ms']:.2f} ms")
    print(f"  gradients still in their views (no copy):       {result['tfm_fused_gradients_in_views_ms']:.2f} ms")
    print(f"  the average copied back instead (before views): {result['tfm_copy_back_ms']:.2f} ms")
    emit_result("fused_copies", {k: round(v, 3) for k, v in result.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
