"""What averaging costs a float16 push_pull on the host: 16M float16 elements pushed and
pulled with ``average=True`` against ``average=False``, alternating in one job (2 workers,
1 server, ``gradpress-launch --local``). The average is taken as the result lands
(``kernels/cpu/fp16.divide_half``); numpy's own float16 divide is a scalar loop.

    python benchmarks/half_average.py [--elements 16777216] [--reps 10]

Goal (the GPU issue): average / sum at most 1.15x. Then, in this process, the sum itself
as a server or a machine's owner takes it (``kernels/cpu/server_sum``): two pushes of 4 MB
partitions' worth of elements (2M) accumulated into float32 and the result rounded back,
float16 against float32 per element, and float16 with the software conversions the sums
used before (still the path of a CPU without F16C). The last line is ``RESULT {json}``
(median seconds of each, and the ratios).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from results import emit as emit_result

WORKER = """
import json, statistics, sys, time, torch, gradpress.torch as bps
bps.init()
n, reps = int(sys.argv[1]), int(sys.argv[2])
x = torch.randn(n).to(torch.float16)
times = {"average": [], "sum": []}
for rep in range(reps + 1):
    for label, average in (("average", True), ("sum", False)):
        y = x.clone()
        t = time.perf_counter()
        bps.push_pull_inplace(y, average=average, name="half." + label)
        if rep:  # the first declares the keys and sets the servers up
            times[label].append(time.perf_counter() - t)
if bps.rank() == 0:
    with open(sys.argv[3], "w") as fh:
        json.dump({k: statistics.median(v) for k, v in times.items()}, fh)
bps.shutdown()
"""


def sum_kernels(reps: int, n: int = 1 << 21) -> dict:
    """Median seconds of a round's sum of two pushes of ``n`` elements: float32, float16,
    and float16 through the software conversions."""
    import statistics
    import time

    import numpy as np

    from gradpress.kernels.cpu import fp16, server_sum
    rng = np.random.default_rng(0)
    pushes32 = [rng.standard_normal(n).astype(np.float32) for _ in range(2)]
    pushes16 = [p.astype(np.float16) for p in pushes32]
    acc, out = np.empty(n, np.float32), np.empty(n, np.float16)

    def f32():
        for j, p in enumerate(pushes32):
            server_sum.accumulate(acc, p, first=j == 0)

    def f16():
        for j, p in enumerate(pushes16):
            server_sum.accumulate(acc, p, first=j == 0)
        server_sum.to_half(acc, out)

    def f16_software():
        for j, p in enumerate(pushes16):
            fp16.from_half_bits(p.view(np.uint16), acc, accumulate=j > 0)
        fp16.to_half_bits(acc, out.view(np.uint16))

    times = {}
    for _ in range(3):  # interleaved, so that the host's drift slows all alike
        for name, run in (("f32", f32), ("f16", f16), ("f16_software", f16_software)):
            run()
            for _ in range(reps):
                t = time.perf_counter()
                run()
                times.setdefault(name, []).append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--elements", type=int, default=16 << 20)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script, out = os.path.join(tmp, "w.py"), os.path.join(tmp, "times.json")
        with open(script, "w") as fh:
            fh.write(WORKER)
        subprocess.run([sys.executable, "-m", "gradpress.launcher", "--local", "--workers", "2", "--servers", "1",
                        "--", sys.executable, script, str(args.elements), str(args.reps), out], check=True)
        with open(out) as fh:
            med = json.load(fh)
    ratio = med["average"] / med["sum"]
    print(f"float16 push_pull of {args.elements} elements, median of {args.reps}: average "
          f"{1e3 * med['average']:.1f} ms, sum {1e3 * med['sum']:.1f} ms: {ratio:.3f}x (goal <= 1.15x)")
    sums = sum_kernels(args.reps)
    print(f"a round's sum of two pushes of 2M elements: float32 {1e3 * sums['f32']:.3f} ms, float16 "
          f"{1e3 * sums['f16']:.3f} ms ({sums['f16'] / sums['f32']:.2f}x), float16 with software conversions "
          f"{1e3 * sums['f16_software']:.3f} ms ({sums['f16_software'] / sums['f32']:.2f}x)")
    emit_result("half_average", {"f16_average_s": round(med["average"], 5), "f16_sum_s": round(med["sum"], 5),
                                "f16_average_over_sum": round(ratio, 3),
                                "sum_f32_ms": round(1e3 * sums["f32"], 4), "sum_f16_ms": round(1e3 * sums["f16"], 4),
                                "sum_f16_software_ms": round(1e3 * sums["f16_software"], 4)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
