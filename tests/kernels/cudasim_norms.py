"""Run by test_norms_cuda.py with NUMBA_ENABLE_CUDASIM=1: the device reductions of
kernels/cuda/norms.py against kernels/reduction.py bit for bit, and the host buffers of
kernels/cuda/scratch.py; prints one JSON line per case ("problem" empty when right)."""
import json
import os
import sys

import numpy as np

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "run under the CUDA simulator"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))

import simulated  # noqa: E402

simulated.prepare()  # before any kernel runs

from numba import cuda  # noqa: E402

from gradpress.kernels.cpu import elementwise as cpu_elementwise  # noqa: E402
from gradpress.kernels.cpu import norms as cpu_norms  # noqa: E402
from gradpress.kernels.cuda import device, norms, scratch  # noqa: E402
from gradpress.kernels.reduction import CHUNK, pairwise_total  # noqa: E402


def totals_cases():
    """The one-block pairing over chunk counts around its switch from global to shared
    memory and odd counts at several levels, on values of mixed magnitude (so that
    another pairing gives other bits)."""
    rng = np.random.default_rng(1)
    shared = norms._SHARED_VALUES
    for chunks in (1, 2, 3, 7, shared - 1, shared, shared + 1, 2 * shared + 1, 3 * shared + 1):
        values = rng.standard_normal((2, chunks)) * 10.0 ** rng.integers(-8, 8, (2, chunks))
        largest = np.abs(rng.standard_normal(chunks))
        work = np.zeros((2, 3, chunks))
        work[0, :2] = values
        work[0, 2] = largest
        totals = cuda.device_array(3, np.float64)
        norms._totals[1, norms.TOTAL_THREADS, device.stream()](cuda.to_device(work), totals)
        got = totals.copy_to_host()
        want = [pairwise_total(values[0].copy()), pairwise_total(values[1].copy()), largest.max()]
        problem = "" if got.tobytes() == np.array(want).tobytes() else f"{got} vs {want}"
        yield f"totals/{chunks}", problem


def chunk_cases():
    """Chunk values and totals of x and of p = g + lam * e over 1, 2 and 3 chunks with a
    partial last one, against the CPU kernels (which follow kernels/reduction.py); and of p
    over 131 chunks, where the last block pairs its first levels in global memory, as every
    partition of 2 MB or more does on a GPU (more chunks than ``_LAST_BLOCK_VALUES``)."""
    rng = np.random.default_rng(2)
    many = (norms._LAST_BLOCK_VALUES + 2) * CHUNK + 77
    for n in (5, 4096, 8192 + 77, many):
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)).astype(np.float32)
        if n < many:  # the simulator takes 10 s for each of the largest
            got = norms.launch_totals(cuda.to_device(x), cuda.to_device(x), np.float64(0), False)
            got = got.copy_to_host()
            want = [cpu_norms.abs_sum(x), cpu_norms.square_sum(x),
                    np.uint32(cpu_norms.max_abs_bits(x)).view(np.float32)]
            yield f"chunks/x/{n}", "" if got.tobytes() == np.array(want).tobytes() else f"{got} vs {want}"
        e = rng.standard_normal(n).astype(np.float32)
        lam = 0.3  # not a float32: p is rounded as the CPU's error feedback rounds it
        p = np.empty(n, np.float32)
        cpu_elementwise.compensate(x, e, lam, p)
        got = norms.launch_totals(cuda.to_device(x), cuda.to_device(e), np.float64(lam), True).copy_to_host()
        want = [cpu_norms.abs_sum(p), cpu_norms.square_sum(p),
                np.uint32(cpu_norms.max_abs_bits(p)).view(np.float32)]
        yield f"chunks/p/{n}", "" if got.tobytes() == np.array(want).tobytes() else f"{got} vs {want}"
    x = np.ones(4100, np.float32)
    x[4097] = np.nan
    got = norms.launch_totals(cuda.to_device(x), cuda.to_device(x), np.float64(0), False).copy_to_host()
    yield "chunks/nan", "" if np.isnan(got[0]) and got[2] == np.inf else f"{got}"
    yield "max-abs-bits", "" if norms.max_abs_bits(cuda.to_device(x)) >= cpu_norms.INF_BITS else "NaN missed"


def host_cases():
    """Pinned payload buffers: the pool never hands out an array whose views live, and
    hands it out again once they are gone; a key's previous payload is written over."""
    first = scratch.pooled_host(100)
    view = first[4:].view(np.uint16)
    del first
    second = scratch.pooled_host(100)
    yield "pool/busy-not-reused", "" if second.ctypes.data != view.ctypes.data - 4 else "handed out twice"
    del view, second
    third = scratch.pooled_host(100)
    yield "pool/free-reused", "" if any(third is a for a in scratch._pool[100][:1]) else "not reused"
    layout = scratch.Layout(((np.float32, 1), (np.uint8, 13)), 2)
    whole = scratch.feedback_host(layout, None)
    views = layout.views(whole)
    again = scratch.feedback_host(layout, views[:2])
    other = scratch.feedback_host(layout, [np.zeros(1, np.float32), np.zeros(13, np.uint8)])
    yield "reuse/same-buffer", "" if again is whole and other is not whole else "not reused, or reused a stranger"


for source in (totals_cases, chunk_cases, host_cases):
    for case, problem in source():
        print(json.dumps({"case": case, "problem": problem}), flush=True)
