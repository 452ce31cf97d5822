"""What a machine's owner pays to sum an uncompressed key's round (``worker/relay.py``), two
local workers, timed on any machine:

- ``accumulator then copy``: the sum into the key's own float32 accumulator (a copy of the
  first contribution, then an add of the second), then a copy into the key's shared push
  segment for the server, as the owner did before;
- ``pair into the segment``: both contributions added in one pass straight into the push
  segment (``server_sum.sum_pair``), as it does now.

    python benchmarks/local_sum.py [--mib 4] [--keys 32] [--repeats 15]

Every key has its own accumulator and segment, as in a job, so ``--keys`` partitions of
``--mib`` MiB are past the caches. Figures are medians over ``--repeats`` passes over all
keys, the two ways alternating, in milliseconds a partition and GB/s of the sum written.
The last line is ``RESULT {json}``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from results import emit  # noqa: E402

from gradpress.kernels.cpu import server_sum  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=float, default=4.0, help="partition size (the default partition)")
    p.add_argument("--keys", type=int, default=32)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    n = int(args.mib * 2 ** 20) // 4
    rng = np.random.default_rng(0)
    mine = [rng.standard_normal(n, np.float32) for _ in range(args.keys)]
    peer = [rng.standard_normal(n, np.float32) for _ in range(args.keys)]
    accs = [np.zeros(n, np.float32) for _ in range(args.keys)]
    segments = [np.zeros(n, np.float32) for _ in range(args.keys)]

    def accumulator_then_copy(i: int) -> None:
        server_sum.accumulate(accs[i], mine[i], first=True)
        server_sum.accumulate(accs[i], peer[i], first=False)
        np.copyto(segments[i], accs[i])

    def pair_into_segment(i: int) -> None:
        server_sum.sum_pair(segments[i], mine[i], peer[i])

    ways = {"accumulator then copy": accumulator_then_copy, "pair into the segment": pair_into_segment}
    for way in ways.values():
        way(0)  # compiled, or loaded from numba's cache
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, way in ways.items():
            start = time.perf_counter()
            for i in range(args.keys):
                way(i)
            seconds[name].append((time.perf_counter() - start) / args.keys)
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    print(f"{'an owner sums two 4-byte contributions':32s} {'ms a partition':>15s} {'GB/s':>7s}")
    for name, s in medians.items():
        print(f"{name:32s} {s * 1e3:15.3f} {4 * n / s / 1e9:7.2f}")
    ratio = medians["pair into the segment"] / medians["accumulator then copy"]
    print(f"pair / accumulator then copy: {ratio:.3f}x")
    emit("local_sum", {"partition_MiB": args.mib, "keys": args.keys,
                       "accumulator_then_copy_ms": round(medians["accumulator then copy"] * 1e3, 4),
                       "pair_into_segment_ms": round(medians["pair into the segment"] * 1e3, 4),
                       "pair_over_before": round(ratio, 3)})


if __name__ == "__main__":
    main()
