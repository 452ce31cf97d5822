"""A server's CPU per round of one random-k key: summed where its values live
(``gradpress/server/values_sum.py``) against the dense path (each push decoded into an
n-element accumulator, then error feedback over all n), the same pushes, alternating.

A round is what the server does between the round's first push and its reply: every
worker's push absorbed (``KeyState.push``, payload checks included) and the aggregate
compressed with the server's error feedback. No sockets: the pushes are prepared first.

    python benchmarks/server_round.py [--elements N] [--k K] [--workers W] [--rounds R]

Prints medians per round and the ratio; the last line is ``RESULT {json}``.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gradpress.compressors import build_compressor  # noqa: E402
from gradpress.server.store import KeyState, Payload  # noqa: E402
from results import emit as emit_result  # noqa: E402

KEY = 7


def round_times(params: dict, n: int, workers: int, pushes: list, dense: bool) -> list[float]:
    state = KeyState(key=KEY, name="w", count=n, dtype="float32", num_workers=workers,
                     compression_params=params)
    if dense:
        state.values_sum = None
    senders = [bytes([65 + w]) for w in range(workers)]
    times = []
    for rnd, round_pushes in enumerate(pushes):
        t0 = time.perf_counter()
        for sender, push in zip(senders, round_pushes):
            state.push(sender, rnd, push)
        times.append(time.perf_counter() - t0)
        assert not state.failure, state.failure
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--elements", type=int, default=1 << 20, help="elements of the key (a 4 MB partition)")
    p.add_argument("--k", type=float, default=0.0015, help="randomk's k (bandwidth.py's gp_randomk: 0.0015)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--trials", type=int, default=3, help="each path this many times, alternating")
    args = p.parse_args()
    params = {"compressor": "randomk", "k": args.k, "ef": "vanilla", "seed": 1}
    rng = np.random.default_rng(0)
    workers = [build_compressor(params, "worker") for _ in range(args.workers)]
    pushes = []
    for rnd in range(args.rounds):
        round_pushes = []
        for w in workers:
            meta, buffers = w.compress(rng.standard_normal(args.elements).astype(np.float32), key=KEY, round=rnd)
            round_pushes.append(Payload(meta, [np.asarray(b).tobytes() for b in buffers]))
        pushes.append(round_pushes)
    results: dict[str, list[float]] = {"values": [], "dense": []}
    for _ in range(args.trials):
        for path in results:
            times = round_times(params, args.elements, args.workers, pushes, path == "dense")
            results[path] += times[2:]  # the first rounds compile and allocate
    values_ms = 1e3 * statistics.median(results["values"])
    dense_ms = 1e3 * statistics.median(results["dense"])
    print(f"randomk k={args.k:g}, {args.elements} elements, {args.workers} workers, medians of "
          f"{len(results['dense'])} rounds per path")
    print(f"  dense path:              {dense_ms:8.3f} ms per round")
    print(f"  summed where values live: {values_ms:8.3f} ms per round  ({dense_ms / values_ms:.1f}x less)")
    emit_result("server_round", {"randomk_server_round_dense_ms": round(dense_ms, 4),
                                "randomk_server_round_values_ms": round(values_ms, 4)})


if __name__ == "__main__":
    main()
