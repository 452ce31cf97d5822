"""Run by test_rows_cuda.py with NUMBA_ENABLE_CUDASIM=1: the GPU row extraction against the
CPU kernels, byte for byte; prints one JSON line per case ("problem" empty when equal)."""
import json
import os
import sys

import numpy as np

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "run under the CUDA simulator"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))

import simulated  # noqa: E402

simulated.prepare()  # before any kernel runs

from gradpress.kernels.cuda import rows as cuda_rows  # noqa: E402
from gradpress.worker.sparse import extract  # noqa: E402


def cases():
    rng = np.random.default_rng(0)
    yield "empty-table", np.zeros((0, 3), np.float32)
    yield "one-zero-row", np.zeros((1, 1), np.float32)
    yield "all-zero", np.zeros((130, 2), np.float32)
    # every row non-zero across three blocks: where atomic insertion loses or reorders rows
    yield "every-row", rng.standard_normal((300, 2)).astype(np.float32)
    m = np.zeros((300, 3), np.float32)
    m[[0, 127, 128, 255, 299], 1] = [1.0, -2.0, 3.5, np.nan, -0.5]  # row 0, block edges, the last row
    m[5, 0] = -0.0  # negative zero is zero on both
    yield "block-edges", m
    sparse = np.where(rng.random((257, 4)) < 0.05, rng.standard_normal((257, 4)), 0).astype(np.float32)
    yield "random", sparse
    # the thread's scratch and staging are reused: fewer rows after more, then more again
    # (a stale flag, offset or row left from the call before would show here)
    yield "fewer-after-more", m[:140]
    yield "more-again", rng.standard_normal((520, 3)).astype(np.float32) * (rng.random((520, 1)) < 0.5)


for name, m in cases():
    got_idx, got_val = cuda_rows.nonzero_rows(m)
    want = extract(m)
    problem = ""
    if got_idx.dtype != want.indices.dtype or got_idx.tobytes() != want.indices.tobytes():
        problem = f"indices differ: {got_idx[:8]} vs {want.indices[:8]}"
    elif got_val.shape != want.values.shape or got_val.tobytes() != want.values.tobytes():
        problem = "values differ"
    print(json.dumps({"case": name, "rows": int(want.indices.size), "problem": problem}), flush=True)
