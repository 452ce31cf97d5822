"""``randomk``: k indices drawn from the stream ``(seed, key, round)`` (see
``kernels.cpu.randomk``), the same on every node, so only the values travel; with
``scaling`` they are multiplied by n/k, which makes D(C(x)) unbiased. Only the sent
values are checked for NaN/inf (the others never leave the node; ErrorFeedback checks the
whole array), so compressing costs O(k) reads, not a pass over x.
Payload: [float32 values (k)]; header ``k``, ``seed``, ``scaled``."""
from typing import Any, Sequence

import numpy as np

from gradpress.compressors.arrays import as_float32, divided
from gradpress.compressors.base import Buffers, Compressor, FeedbackRefused
from gradpress.kernels.cpu import randomk
from gradpress.kernels.rng import stream_id
from gradpress.compressors.params import flag, keep_count, number
from gradpress.compressors.payload import expect_buffer_count, header_choice, header_int
from gradpress.compressors.registry import register
from gradpress.compressors.sparse import (
    decode_pairs, k_from_params, reject_non_finite, values_buffer)
from gradpress.errors import NonFiniteInput


def chosen_indices(n: int, k: int, seed: int, key: int, round: int) -> np.ndarray:
    """The k indices of ``(seed, key, round)``, increasing (a GPU worker computes the same
    set ahead on the host or draws it on the device: ``kernels/cuda/randomk.py``)."""
    return randomk.random_indices(n, k, stream_id(seed, key, round))


@register
class RandomK(Compressor):
    name = "randomk"
    ACCEPTED_PARAMS = {"k": "below 1: fraction of elements kept; otherwise a count (0.01)",
                       "seed": "random stream seed shared by all nodes (0)",
                       "scaling": "multiply values by n/k, unbiased (false)"}

    def __init__(self, k: float = 0.01, seed: int = 0, scaling: bool = False) -> None:
        self.k, self.seed, self.scaling = k, seed, scaling

    @classmethod
    def from_params(cls, params: dict) -> "RandomK":
        return cls(k_from_params(params), number(params, "seed", 0, 0, 2 ** 63 - 1, True),
                   flag(params, "scaling", False))

    def encoded_nbytes(self, n: int, itemsize: int) -> int:
        return 4 * keep_count(self.k, n)

    def _encode(self, x: np.ndarray, key: int, round: int) -> tuple[dict, list]:
        x = as_float32(x)
        n, k = x.shape[0], keep_count(self.k, x.shape[0])
        values = np.empty(k, np.float32)
        randomk.gather_scaled(x, chosen_indices(n, k, self.seed, key, round),
                              n / k if self.scaling else 1.0, values)
        reject_non_finite(values, self.name)
        return self._fields(k), [values]

    def _encode_feedback(self, g: np.ndarray, e: np.ndarray, lam: float, e_out: np.ndarray,
                         key: int, round: int, reuse: Buffers | None) -> tuple[dict, list]:
        n, k = g.shape[0], keep_count(self.k, g.shape[0])
        values = np.empty(k, np.float32)
        bitmap = randomk.random_bitmap(n, k, stream_id(self.seed, key, round))
        if not randomk.gather_feedback(g, e, lam, e_out, bitmap,
                                       n / k if self.scaling else 1.0, values):
            raise FeedbackRefused(self.name)
        return self._fields(k), [values]

    def _encode_device_feedback(self, g: Any, e: Any, lam: float, e_out: Any, key: int,
                                round: int, reuse: Buffers | None) -> tuple[dict, list]:
        from gradpress.kernels.cuda import randomk as gpu_randomk
        n, k = g.shape[0], keep_count(self.k, g.shape[0])
        values = gpu_randomk.gather_feedback(g, e, lam, e_out, n, k, self._stream(key, round, n, k),
                                             n / k if self.scaling else 1.0, reuse)
        if values is None:
            raise FeedbackRefused(self.name)
        return self._fields(k), [values]

    def encode_device_partitions(self, g: Any, e: Any, lam: float, e_out: Any, part: int, reuse: Any,
                                 keys: list, rounds: list) -> tuple[list, Any]:
        """``_encode_device_feedback`` of each ``part`` elements of g at once (a tensor's
        partitions, by ``ErrorFeedback.compress_partitions``), partition i being ``keys[i]``
        in ``rounds[i]``: per partition (fields, buffers) or None where refused, and the
        host array they live in."""
        from gradpress.kernels.cuda import randomk as gpu_randomk
        n = g.shape[0]
        counts = [min(part, n - i * part) for i in range(len(keys))]
        ks = [keep_count(self.k, c) for c in counts]
        streams = [self._stream(key, r, c, k) for key, r, c, k in zip(keys, rounds, counts, ks)]
        scales = tuple(c / k if self.scaling else 1.0 for c, k in ((counts[0], ks[0]), (counts[-1], ks[-1])))
        encoded, host = gpu_randomk.gather_feedback_segments(g, e, lam, e_out, part, ks, streams, scales, reuse)
        return [None if values is None else (self._fields(k), [values]) for values, k in zip(encoded, ks)], host

    def _encode_device(self, x: Any, key: int, round: int) -> tuple[dict, list]:
        from gradpress.kernels.cuda import randomk as gpu_randomk
        n, k = x.shape[0], keep_count(self.k, x.shape[0])
        values = gpu_randomk.gather_scaled(x, n, k, self._stream(key, round, n, k),
                                           n / k if self.scaling else 1.0)
        if values is None:
            raise NonFiniteInput(f"{self.name} input contains NaN or inf")
        return self._fields(k), [values]

    def _stream(self, key: int, round: int, n: int, k: int) -> np.uint64:
        """The stream of this round on a GPU worker; the next round's indices are computed
        ahead meanwhile on the host (``kernels/cuda/randomk_ahead.py``)."""
        from gradpress.kernels.cuda import randomk_ahead
        randomk_ahead.compute(n, k, stream_id(self.seed, key, round + 1))
        return stream_id(self.seed, key, round)

    def _fields(self, k: int) -> dict:
        return {"k": k, "seed": self.seed, "scaled": self.scaling}

    def _decode(self, header: dict, buffers: Sequence[Any], out: np.ndarray, accumulate: bool,
                key: int, round: int, divisor: int = 1) -> None:
        n = out.shape[0]
        k, seed, values = self._sent(header, buffers, n)
        decode_pairs(chosen_indices(n, k, seed, key, round), divided(values, divisor), out, accumulate)

    def _decode_device(self, header: dict, buffers: Sequence[Any], out: Any, key: int, round: int,
                       divisor: int) -> bool:
        from gradpress.kernels.cuda import decode, randomk as gpu_randomk, randomk_ahead
        n = out.shape[0]
        k, seed, values = self._sent(header, buffers, n)
        indices = gpu_randomk.device_indices(n, k, stream_id(seed, key, round), "randomk-decode-indices")
        randomk_ahead.compute(n, k, stream_id(seed, key, round + 1))
        decode.scatter_drawn(indices, values, out, divisor)
        return True

    def sent_values(self, header: dict, buffers: Sequence[Any], n: int) -> tuple | None:
        """``(k, seed, values)`` of a payload for ``n`` elements, checked as decompressing
        it checks them (ValueError); None for a raw payload. A server sums these where
        they live (``gradpress.server.values_sum``)."""
        self._check_header(header, n)
        return None if "raw" in header else self._sent(header, buffers, n)

    @staticmethod
    def _sent(header: dict, buffers: Sequence[Any], n: int) -> tuple[int, int, np.ndarray]:
        k = header_int(header, "k", 1, n)
        seed = header_int(header, "seed", 0, 2 ** 63 - 1)
        header_choice(header, "scaled", (False, True))  # values arrive already scaled
        expect_buffer_count(buffers, 1)
        return k, seed, values_buffer(buffers, 0, k)

    def __repr__(self) -> str:
        return f"RandomK(k={self.k:g}, seed={self.seed}, scaling={self.scaling})"
