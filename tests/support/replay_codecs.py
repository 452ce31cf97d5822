"""Numpy replays' building blocks: the codecs' round trips (reference codecs) and the
error-feedback arithmetic as the kernels compute it, for the optimizers' replay tests."""
from __future__ import annotations

import numpy as np

from gradpress.compressors import reference as ref
from gradpress.compressors.params import keep_count


def f32(a: np.ndarray, alpha: float, b: np.ndarray) -> np.ndarray:
    """``a + alpha * b`` as the error-feedback kernels compute it: float64, rounded to float32."""
    return (a.astype(np.float64) + alpha * b.astype(np.float64)).astype(np.float32)


def roundtrip(params: dict, x: np.ndarray) -> np.ndarray:
    """D(C(x)) of the deterministic codecs (onebit with a scale, topk)."""
    n = x.shape[0]
    if params["compressor"] == "onebit":
        return ref.onebit_decode(ref.onebit(x, params["scaling"]), n)
    if params["compressor"] == "topk":
        return ref.pairs_decode(*ref.topk(x, keep_count(params["k"], n)), n)
    raise ValueError(f"no replay for {params['compressor']}")


class TwoWayEF:
    """Both sides' error feedback of one job: worker residuals per (tensor, worker,
    partition), server residuals per (tensor, partition)."""

    def __init__(self, params: dict, parts: list[int]):
        self.params, self.parts = params, parts
        self.worker_e: dict = {}
        self.server_e: dict = {}

    def average(self, tensor: str, pushed: list[np.ndarray]) -> np.ndarray:
        """What every worker pulls for ``pushed`` (one array per worker), partition by partition."""
        lo, pulled = 0, np.empty_like(pushed[0])
        for i, size in enumerate(self.parts):
            acc = np.zeros(size, np.float32)
            for r, x in enumerate(pushed):
                x = x[lo:lo + size]
                e = self.worker_e.get((tensor, r, i))
                x = x if e is None else f32(x, 1.0, e)
                d = roundtrip(self.params, x)
                self.worker_e[(tensor, r, i)] = x - d
                acc += d
            e = self.server_e.get((tensor, i))
            s = acc if e is None else f32(acc, 1.0, e)
            d = roundtrip(self.params, s)
            self.server_e[(tensor, i)] = s - d
            pulled[lo:lo + size] = d / np.float32(len(pushed))
            lo += size
        return pulled
