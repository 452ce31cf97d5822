"""The host side of a GPU worker's compress stage, measured on a machine without a GPU.

A GPU worker's compress stage is launches, copies and Python (issue 34's goal: 2 ms a step
for the 102-gradient transformer; 19-207 ms measured on an H200). This benchmark runs the
CUDA path of each codec with error feedback under numba's CUDA simulator with every kernel
launch stubbed out (counted, not run), over the partitions the transformer's job
compresses (the gradients of at least BYTEPS_MIN_COMPRESS_BYTES, cut at
BYTEPS_PARTITION_BYTES). What it times is what the host does per partition besides the
kernels: gradpress's own Python, and the simulator's array plumbing where a GPU has
numba's (views, copies of the payload into host memory). It is a proxy: numba's real
launches and driver calls (about 25 us a launch on an H200) come on top, one per counted
launch. The ``-together`` ways (every codec) compress each tensor's partitions together
(``GRADPRESS_GROUP_PARTITIONS``, a worker's default where no local owner sums them first):
one set of launches per tensor. The ``-fused`` ways compress the job's gradients fused into
buckets of 32 MiB (GRADPRESS_FUSE_COMPRESSED_BYTES, ``gpu.fused_job``): one set of launches
per bucket, each bucket's partitions together, fewer and fuller partitions. The copy of a
bucket's members into its buffer (one ``torch.cat`` a bucket, on the device on a GPU) is
neither timed nor counted here.

    python benchmarks/compress_host.py [--reps N]

The last line is ``RESULT {json}`` (``results.emit``: a record too, where asked).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before numba loads
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402
from numba.cuda.simulator import kernel as simulated  # noqa: E402

from bandwidth_models import MODELS  # noqa: E402
from gpu import ENCODERS, FUSED_BYTES, GROUPED, compress_stage, fused_job  # noqa: E402  (gpu.py's, on a GPU)
from results import emit  # noqa: E402

from gradpress.compressors import build_compressor  # noqa: E402
from gradpress.config import Settings  # noqa: E402
from gradpress.placement import partition_counts  # noqa: E402

launched = [0]


def _counted(self, *args):
    """A kernel launch that is counted and not run (device functions run: none is called
    from the host here)."""
    if self._device:
        return self.fn(*args)
    launched[0] += 1


def _zeroed(shape, dtype=np.float64, stream=0, **_):
    return cuda.to_device(np.zeros(shape, dtype), stream=stream)


def job_tensors(fused: bool) -> list[list[int]]:
    """Element counts of the partitions of each tensor the transformer's job compresses (with
    ``fused``, of each bucket of them)."""
    settings = Settings()
    params = list(MODELS["tfm"].build().parameters())
    if fused:
        return [counts for _, counts in fused_job(params, settings, FUSED_BYTES)]
    return [partition_counts(p.numel(), 4, settings.partition_bytes) for p in params
            if p.numel() * 4 >= settings.min_compress_bytes]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=15, help="steps timed per codec (after 2 untimed)")
    args = ap.parse_args()
    simulated.FakeCUDAKernel.__call__ = _counted
    # what the stubbed kernels would have written is read back as flags (NaN found, fallback
    # taken): device memory starts zeroed, so every flag reads "none"
    cuda.device_array = _zeroed
    rng = np.random.default_rng(0)
    layouts = {fused: [(cuda.to_device(rng.standard_normal(sum(counts), dtype=np.float32)), counts)
                       for counts in job_tensors(fused)] for fused in (False, True)}
    tensors = layouts[False]
    parts = sum(len(counts) for _, counts in tensors)
    out: dict = {"partitions": parts, "tensors": len(tensors), "elements": sum(sum(c) for _, c in tensors),
                 "fused_buckets": len(layouts[True]), "fused_partitions": sum(len(c) for _, c in layouts[True])}
    ways = [(name, params, False, tensors) for name, params in {**ENCODERS, **GROUPED}.items()] + \
        [(f"{name}-together", params, True, tensors) for name, params in GROUPED.items()] + \
        [(f"{name}-fused", params, True, layouts[True]) for name, params in GROUPED.items()]
    # the ways take turns, step by step: this host's speed drifts by tens of percent within a
    # minute, and each way's median then comes from the same minutes
    codecs = [build_compressor(params, "worker") for _, params, _, _ in ways]
    times: list[list[float]] = [[] for _ in ways]
    launches = [0] * len(ways)
    for step in range(args.reps + 2):
        for w in (range(len(ways)) if step % 2 else reversed(range(len(ways)))):
            launched[0] = 0
            start = time.perf_counter()
            compress_stage(codecs[w], ways[w][3], step, ways[w][2])
            if step >= 2:
                times[w].append(time.perf_counter() - start)
            launches[w] = launched[0]
    for (name, _, _, _), took, launch_count in zip(ways, times, launches):
        median = statistics.median(took)
        out[f"{name}_stage_ms"] = round(1e3 * median, 3)
        out[f"{name}_us_per_partition"] = round(1e6 * median / parts, 1)
        out[f"{name}_launches_per_partition"] = launch_count / parts
        print(f"{name:8s} {1e3 * median:8.2f} ms a step  {1e6 * median / parts:7.1f} us a partition  "
              f"{launch_count / parts:5.1f} launches a partition", flush=True)
    emit("compress_host", out)


if __name__ == "__main__":
    main()
