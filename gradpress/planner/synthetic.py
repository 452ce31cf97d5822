"""A synthetic profile of a transformer-like model: for timing decisions and for tests.

Its sizes mimic a transformer (embedding, per block four weight matrices, their biases
and two norms); its costs are round numbers of the order measured on a 2-core machine
(docs/history/performance-2026.md). It is never used to plan a real job.
"""
from __future__ import annotations

from .profile import CodecCost, LinearCost, Link, Profile, TensorProfile


def synthetic_profile(n_tensors: int = 200, workers: int = 2, servers: int = 2,
                      bytes_per_s: float = 125e6) -> Profile:
    width = 512
    shapes = []
    while len(shapes) < n_tensors:
        shapes += [4 * width * width, 4 * width, 4 * width * 4, 4 * 4 * width, 4 * width * 4 * width,
                   4 * 4 * width, 4 * 4 * width * width, 4 * width, 4 * width, 4 * width]
    shapes = shapes[:n_tensors]
    compute = 0.2
    tensors, t = [], 0.05
    for i, nbytes in enumerate(shapes):
        t += compute * 0.75 * nbytes / sum(shapes)
        tensors.append(TensorProfile(f"t{i}", nbytes, t, priority=-(n_tensors - 1 - i)))

    def per_gbps(fixed_us: float, gb_per_s: float) -> LinearCost:
        return LinearCost(fixed_us * 1e-6, 1 / (gb_per_s * 1e9))
    codecs = {
        "none": CodecCost(per_gbps(5, 5), per_gbps(5, 4), per_gbps(5, 8), 1.0),
        "fp16": CodecCost(per_gbps(10, 3), per_gbps(10, 3), per_gbps(10, 4), 0.5),
        "onebit": CodecCost(per_gbps(20, 2), per_gbps(20, 3), per_gbps(20, 3), 1 / 32),
        "topk": CodecCost(per_gbps(30, 0.8), per_gbps(20, 4), per_gbps(20, 4), 0.02),
        "randomk": CodecCost(per_gbps(20, 2), per_gbps(20, 4), per_gbps(20, 4), 0.01),
    }
    return Profile(workers, servers, tuple(tensors), compute + 0.05, 0.01, codecs, Link(50e-6, bytes_per_s),
                   message_s=100e-6)
