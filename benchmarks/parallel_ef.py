"""Do parallel kernels help the worker's error-feedback compression on this machine?

Compares the serial fused passes of ``gradpress.kernels.cpu`` with ``parallel=True``
versions of the same passes (``prange`` over the same 4096-element chunks, so the results
are identical) at 1 and at all cores: onebit's norm pass (reads g and e) and the
randomk/topk pass (reads g and e, writes p, checks finiteness).

    python benchmarks/parallel_ef.py [--quick] [--reps N]

Prints a table; the last line is ``RESULT {json}`` (input GB/s).
"""
import argparse
import os
import statistics
import sys
import time

import numba
import numpy as np
from numba import njit, prange

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gradpress.kernels.cpu import onebit  # noqa: E402
from gradpress.kernels.cpu.elementwise import compensate, compensate_checked  # noqa: E402
from gradpress.kernels.cpu.norms import chunk_sum, max_abs_bits  # noqa: E402
from gradpress.kernels.reduction import CHUNK, LANES, pairwise_total  # noqa: E402
from results import emit as emit_result  # noqa: E402


@njit(parallel=True, nogil=True, cache=True)
def norms_parallel(g, e, lam):
    n = g.shape[0]
    chunks = (n + CHUNK - 1) // CHUNK
    l1 = np.empty(chunks)
    for c in prange(chunks):
        start, end = c * CHUNK, min((c + 1) * CHUNK, n)
        block = np.empty(end - start, np.float32)
        compensate(g[start:end], e[start:end], lam, block)
        l1[c] = chunk_sum(block, 0, False, np.empty(LANES))
    return pairwise_total(l1)


@njit(parallel=True, nogil=True, cache=True)
def compensate_parallel(g, e, lam, out):
    n = g.shape[0]
    chunks = (n + CHUNK - 1) // CHUNK
    largest = np.zeros(chunks, np.int64)
    for c in prange(chunks):
        start, end = c * CHUNK, min((c + 1) * CHUNK, n)
        compensate(g[start:end], e[start:end], lam, out[start:end])
        largest[c] = max_abs_bits(out[start:end])
    return largest.max()


def median_seconds(run, reps: int) -> float:
    run()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16M elements instead of 64M")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    n = (16 if args.quick else 64) << 20
    g = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    e = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    out = np.empty_like(g)
    gb = g.nbytes / 1e9
    assert norms_parallel(g, e, 1.0) == onebit._feedback_norms(g, e, 1.0, False)[0]
    result = {"elements": n, "threading_layer": None, "cores": os.cpu_count()}
    cases = {
        "onebit_norm_serial": lambda: onebit._feedback_norms(g, e, 1.0, False),
        "onebit_norm_parallel": lambda: norms_parallel(g, e, 1.0),
        "sparse_pass_serial": lambda: compensate_checked(g, e, 1.0, out),
        "sparse_pass_parallel": lambda: compensate_parallel(g, e, 1.0, out),
    }
    for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        numba.set_num_threads(threads)
        for name, run in cases.items():
            if name.endswith("serial") and threads > 1:
                continue
            label = f"{name}_{threads}t_GBps" if name.endswith("parallel") else f"{name}_GBps"
            result[label] = gb / median_seconds(run, args.reps)
            print(f"{label:<32} {result[label]:7.2f} GB/s")
    result["threading_layer"] = numba.threading_layer()
    emit_result("parallel_ef", {k: round(v, 3) if isinstance(v, float) else v
                               for k, v in result.items()})


if __name__ == "__main__":
    main()
