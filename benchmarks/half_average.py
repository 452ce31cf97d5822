"""What averaging costs a float16 push_pull on the host: 16M float16 elements pushed and
pulled with ``average=True`` against ``average=False``, alternating in one job (2 workers,
1 server, ``gradpress-launch --local``). The average is taken as the result lands
(``kernels/cpu/fp16.divide_half``); numpy's own float16 divide is a scalar loop.

    python benchmarks/half_average.py [--elements 16777216] [--reps 10]

Goal (the GPU issue): average / sum at most 1.15x. The last line is ``RESULT {json}``
(median seconds of each, and their ratio).
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
    emit_result("half_average", {"f16_average_s": round(med["average"], 5), "f16_sum_s": round(med["sum"], 5),
                                "f16_average_over_sum": round(ratio, 3)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
