"""Run by test_randomk_draws_cuda.py with NUMBA_ENABLE_CUDASIM=1: random-k's index sets drawn
on the GPU (``kernels/cuda/randomk_draws.py``) against Floyd's algorithm on the host
(``kernels/cpu/randomk.random_indices``), byte for byte; prints one JSON line per case
("problem" empty when equal; "chain": the most hops back a step's collision test takes
in that case, replayed here on the host)."""
import json
import os
import sys
import time

import numpy as np
from numba import cuda

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "run under the CUDA simulator"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))

import simulated  # noqa: E402

simulated.prepare()  # before any kernel runs

from gradpress.kernels.cpu import randomk as cpu_randomk  # noqa: E402
from gradpress.kernels.cpu.randomk import random_indices  # noqa: E402
from gradpress.kernels.cuda import randomk as gpu_randomk, randomk_ahead, randomk_draws  # noqa: E402
from gradpress.kernels.rng import below_py, draw_bits_py, stream_id  # noqa: E402


def longest_chain(n: int, k: int, stream) -> int:
    """The most times a step's collision test follows u = r - (n - k) back to an earlier
    step, over all the steps (0: never), replayed on the host from the draws."""
    draws = [int(below_py(draw_bits_py(np.uint64(stream), np.uint64(t)), np.uint64(n - k + t + 1)))
             for t in range(k)]
    first: dict[int, int] = {}
    for t, r in enumerate(draws):
        first.setdefault(r, t)
    longest = 0
    for step in range(k):
        at, hops = step, 0
        while first[draws[at]] >= at and n - k <= draws[at] < n - k + at:
            at, hops = draws[at] - (n - k), hops + 1
        longest = max(longest, hops)
    return longest


def expected(seg_len: int, k_full: int, n_last: int, k_last: int, streams: list) -> np.ndarray:
    parts = []
    for s, stream in enumerate(streams):
        n, k = (n_last, k_last) if s == len(streams) - 1 else (seg_len, k_full)
        parts.append(random_indices(n, k, stream).astype(np.uint32) + np.uint32(s * seg_len))
    return np.concatenate(parts)


def cases():
    # past 32,768 elements the bitmap takes several blocks: counts, their scan, then each block's place
    one = [(1, 1), (2, 1), (2, 2), (33, 33), (100, 90), (100, 99), (70, 33), (1000, 10), (4097, 2000),
           (40_000, 400), (70_001, 69_000)]
    for i, (n, k) in enumerate(one):
        yield f"one-{n}-{k}", (n, k, n, k, [stream_id(7, i, 3)])
    # a tensor's partitions: the last one shorter, with fewer draws; word edges inside
    yield "segments-5", (64, 20, 37, 12, [stream_id(1, key, 9) for key in range(5)])
    yield "segments-dense", (40, 39, 40, 39, [stream_id(2, key, 0) for key in range(3)])
    yield "segments-last-one", (50, 5, 1, 1, [stream_id(3, key, 4) for key in range(4)])
    yield "segments-wide", (20_000, 200, 5_000, 50, [stream_id(5, key, 2) for key in range(3)])
    # the scratch is reused: fewer after more (a stale bit or table slot would show)
    yield "fewer-after-more", (90, 45, 90, 45, [stream_id(4, 0, 1)])


for name, (seg_len, k_full, n_last, k_last, streams) in cases():
    got = randomk_draws.draw(seg_len, k_full, n_last, k_last, streams, "randomk-indices").copy_to_host()
    want = expected(seg_len, k_full, n_last, k_last, streams)
    chain = max(longest_chain(seg_len if s < len(streams) - 1 else n_last,
                              k_full if s < len(streams) - 1 else k_last, stream) for s, stream in enumerate(streams))
    problem = ""
    if got.dtype != np.uint32 or got.tobytes() != want.tobytes():
        problem = f"{got.size} indices {got[:10]}, expected {want.size}: {want[:10]}"
    print(json.dumps({"case": name, "chain": chain, "problem": problem}), flush=True)

def computed_ahead(*draws) -> bool:
    """Start each (n, k, stream) ahead and wait (10 s at most) until every one is ready."""
    for n, k, stream in draws:
        randomk_ahead.compute(n, k, stream)
    for _ in range(1000):
        if all(randomk_ahead.ready(*d) is not None for d in draws):
            return True
        time.sleep(0.01)
    return False


def segments_case(seg_len: int, ks: list, streams: list) -> str:
    """``gather_feedback_segments`` (its values and residual) against the CPU kernel per
    segment."""
    rng = np.random.default_rng(len(streams))
    n = seg_len * (len(ks) - 1) + 23
    g, e = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    e_out = cuda.device_array(n, np.float32)
    got, _ = gpu_randomk.gather_feedback_segments(cuda.to_device(g), cuda.to_device(e), 0.5, e_out, seg_len, ks,
                                                  streams, (1.0, 1.0), None)
    want_e = np.empty(n, np.float32)
    for s, (k, stream) in enumerate(zip(ks, streams)):
        lo, hi = s * seg_len, min(n, (s + 1) * seg_len)
        values = np.empty(k, np.float32)
        bitmap = cpu_randomk.random_bitmap(hi - lo, k, stream)
        cpu_randomk.gather_feedback(g[lo:hi], e[lo:hi], 0.5, want_e[lo:hi], bitmap, 1.0, values)
        if got[s] is None or got[s].tobytes() != values.tobytes():
            return f"segment {s}: values differ"
    return "" if e_out.copy_to_host().tobytes() == want_e.tobytes() else "residuals differ"


# a round's indices computed ahead on the host go up instead of being drawn: the same bytes
stream = stream_id(9, 1, 1)
ready = computed_ahead((500, 120, stream))
got = gpu_randomk.device_indices(500, 120, stream).copy_to_host()
print(json.dumps({"case": "ahead/one", "problem": "" if ready and got.tobytes() == random_indices(500, 120, stream)
                  .tobytes() else f"ready {ready}, indices {got[:8]}"}))
streams, ks = [stream_id(9, key, 2) for key in range(3)], [30, 30, 7]
print(json.dumps({"case": "ahead/segments-drawn", "problem": segments_case(100, ks, streams)}))
ready = computed_ahead(*[(c, k, st) for c, k, st in zip((100, 100, 23), ks, streams)])
uploaded = segments_case(100, ks, streams) if ready else "not ready"
print(json.dumps({"case": "ahead/segments-uploaded", "problem": uploaded}))

empty = randomk_draws.draw(0, 0, 0, 0, [np.uint64(1)], "randomk-indices")
print(json.dumps({"case": "empty", "problem": "" if empty.shape == (0,) else f"{empty.shape}"}))
try:
    randomk_draws.draw(10, 11, 10, 11, [np.uint64(1)], "randomk-indices")
    print(json.dumps({"case": "refused", "problem": "more draws than elements were accepted"}))
except ValueError as e:
    print(json.dumps({"case": "refused", "problem": "" if "out of range" in str(e) else str(e)}))
