"""``topk``: the k entries of largest magnitude (ties: lowest index first), in increasing
index order. Payload: [uint32 indices (k)], [float32 values (k)]; header ``k``."""
from typing import Any, Sequence

import numpy as np

from gradpress.compressors.arrays import as_float32, divided
from gradpress.compressors.base import Buffers, Compressor, FeedbackRefused
from gradpress.kernels.cpu import topk
from gradpress.compressors.payload import buffer_array, expect_buffer_count, header_int
from gradpress.compressors.params import keep_count
from gradpress.compressors.registry import register
from gradpress.compressors.sparse import checked_indices, decode_pairs, k_from_params, values_buffer
from gradpress.errors import NonFiniteInput


@register
class TopK(Compressor):
    name = "topk"
    ACCEPTED_PARAMS = {"k": "below 1: fraction of elements kept; otherwise a count (0.01)"}

    def __init__(self, k: float = 0.01) -> None:
        self.k = k

    @classmethod
    def from_params(cls, params: dict) -> "TopK":
        return cls(k_from_params(params))

    def encoded_nbytes(self, n: int, itemsize: int) -> int:
        return 8 * keep_count(self.k, n)

    def _encode(self, x: np.ndarray, key: int, round: int) -> tuple[dict, list]:
        x = as_float32(x)
        k = keep_count(self.k, x.shape[0])
        indices = np.empty(k, np.uint32)
        values = np.empty(k, np.float32)
        if not topk.topk(x, indices, values):
            raise NonFiniteInput(f"{self.name} input contains NaN or inf")
        return {"k": k}, [indices, values]

    def _encode_feedback(self, g: np.ndarray, e: np.ndarray, lam: float, e_out: np.ndarray,
                         key: int, round: int, reuse: Buffers | None) -> tuple[dict, list]:
        k = keep_count(self.k, g.shape[0])
        indices = np.empty(k, np.uint32)
        values = np.empty(k, np.float32)
        if not topk.topk_feedback(g, e, lam, e_out, indices, values):
            raise FeedbackRefused(self.name)
        return {"k": k}, [indices, values]

    def _encode_device_feedback(self, g: Any, e: Any, lam: float, e_out: Any, key: int,
                                round: int, reuse: Buffers | None) -> tuple[dict, list]:
        from gradpress.kernels.cuda import topk as gpu_topk
        k = keep_count(self.k, g.shape[0])
        selected = gpu_topk.select_topk_feedback(g, e, lam, e_out, k, reuse)
        if selected is None:
            raise FeedbackRefused(self.name)
        return {"k": k}, list(selected)

    def encode_device_partitions(self, g: Any, e: Any, lam: float, e_out: Any, part: int, reuse: Any,
                                 keys: list, rounds: list) -> tuple[list, Any]:
        """``_encode_device_feedback`` of each ``part`` elements of g at once (a tensor's
        partitions, by ``ErrorFeedback.compress_partitions``): per partition (fields,
        buffers) or None where refused, and the host array they live in."""
        from gradpress.kernels.cuda import topk_segments
        n = g.shape[0]
        ks = [keep_count(self.k, min(part, n - i * part)) for i in range(len(keys))]
        selected, host = topk_segments.select_feedback_segments(g, e, lam, e_out, part, ks[0], ks[-1], reuse)
        return [None if pair is None else ({"k": k}, list(pair)) for pair, k in zip(selected, ks)], host

    def _encode_device(self, x: Any, key: int, round: int) -> tuple[dict, list]:
        from gradpress.kernels.cuda import topk as gpu_topk
        k = keep_count(self.k, x.shape[0])
        indices, values = gpu_topk.select_topk(x, k)
        return {"k": k}, [indices, values]

    def _decode(self, header: dict, buffers: Sequence[Any], out: np.ndarray, accumulate: bool,
                key: int, round: int, divisor: int = 1) -> None:
        indices, values = self._sent(header, buffers, out.shape[0])
        decode_pairs(indices, divided(values, divisor), out, accumulate)

    def _decode_device(self, header: dict, buffers: Sequence[Any], out: Any, key: int, round: int,
                       divisor: int) -> bool:
        from gradpress.kernels.cuda import decode
        indices, values = self._sent(header, buffers, out.shape[0])
        decode.scatter(checked_indices(indices, out.shape[0]), values, out, divisor)
        return True

    @staticmethod
    def _sent(header: dict, buffers: Sequence[Any], n: int) -> tuple[np.ndarray, np.ndarray]:
        k = header_int(header, "k", 0, n)
        expect_buffer_count(buffers, 2)
        return buffer_array(buffers, 0, np.uint32, k, "indices"), values_buffer(buffers, 1, k)

    def __repr__(self) -> str:
        return f"TopK(k={self.k:g})"
