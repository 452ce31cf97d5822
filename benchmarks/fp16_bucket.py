"""What a fused bucket's landing costs with ``Compression.fp16`` (``pipeline/routes/bucket.py``),
the two ways a bucket can take it, timed on any machine:

- ``decompress``: the compressor's ``decompress`` (a new float32 tensor widened from the
  float16 average), then a copy into each member's tensor, as a bucket does for a tensor
  compressor without ``decompress_into``;
- ``decompress_into``: the average widened straight into the bucket's buffer, whose views
  the members hold (DistributedOptimizer's gradients, ``views``), as ``Compression.fp16``
  does now.

    python benchmarks/fp16_bucket.py [--mib 16] [--members 8] [--repeats 15]

The push_pull is left out: a stand-in ``Comm`` hands back the same float16 average every
step, so only the bucket's own work is timed (its fill, the cast, the landing). Figures are
medians of ``--repeats`` steps, the two ways alternating, in milliseconds a step, on one
torch thread. The last line is ``RESULT {json}``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from results import emit  # noqa: E402

from gradpress.pipeline.routes.bucket import Bucket  # noqa: E402
from gradpress.torch.compression import Compression, TensorCompressor  # noqa: E402


class WithoutInto(TensorCompressor):
    """``Compression.fp16`` without ``decompress_into``: the bucket's generic landing."""
    compress = staticmethod(Compression.fp16.compress)
    decompress = staticmethod(Compression.fp16.decompress)


class Averaged:
    """A ``Comm`` whose push_pull returns ``average`` at once (what the job would land)."""

    def __init__(self, average: torch.Tensor):
        self.average = average

    def start(self, tensor, name, **_):
        return 0

    def wait(self, handle):
        return self.average


def step(bucket: Bucket, grads: list[torch.Tensor]) -> float:
    start = time.perf_counter()
    for p, g in zip(bucket.members, grads):
        bucket.submit(p, g)
    out = bucket.finish()
    elapsed = time.perf_counter() - start
    for i, p in enumerate(bucket.members):  # backward adds into what the bucket handed back
        grads[i] = out[id(p)]
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=float, default=16.0, help="the bucket's float32 bytes")
    p.add_argument("--members", type=int, default=8)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    torch.set_num_threads(1)
    each = int(args.mib * 2 ** 20) // 4 // args.members
    average = torch.randn(each * args.members).half()
    ways = {"decompress": WithoutInto, "decompress_into": Compression.fp16}
    runs = {}
    for name, compression in ways.items():
        members = [torch.zeros(each) for _ in range(args.members)]
        bucket = Bucket(f"fp16.{name}", members, None, 0, Averaged(average), views=True, compression=compression)
        grads = [torch.randn(each) for _ in members]
        step(bucket, grads)  # the buffer is made; the members then hold its views
        runs[name] = (bucket, grads)
    times = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, (bucket, grads) in runs.items():
            times[name].append(step(bucket, grads))
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    for name, value in ms.items():
        print(f"{name:>16s}: {value:7.3f} ms a step")
    ratio = ms["decompress_into"] / ms["decompress"]
    print(f"decompress_into / decompress: {ratio:.3f}x")
    emit("fp16_bucket", {"mib": args.mib, "members": args.members, "repeats": args.repeats,
                         "decompress_ms": round(ms["decompress"], 3),
                         "decompress_into_ms": round(ms["decompress_into"], 3), "ratio": round(ratio, 3)})


if __name__ == "__main__":
    main()
