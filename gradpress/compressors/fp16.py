"""``fp16``: cast to IEEE half precision; the payload is exactly numpy's
``x.astype(float16)`` bits (NaN and inf pass through, values beyond 65504 become inf).
Payload: [uint16 bits (n)]. float16 input travels raw (the same bits)."""
from typing import Any, Sequence

import numpy as np

from gradpress.compressors.arrays import divide_in_place
from gradpress.compressors.base import Buffers, Compressor, FeedbackRefused, reusable
from gradpress.kernels.cpu import fp16
from gradpress.compressors.payload import buffer_array, expect_buffer_count
from gradpress.compressors.registry import register


@register
class Fp16(Compressor):
    name = "fp16"

    @classmethod
    def from_params(cls, params: dict) -> "Fp16":
        return cls()

    def encoded_nbytes(self, n: int, itemsize: int) -> int:
        return 2 * n

    def _encode(self, x: np.ndarray, key: int, round: int) -> tuple[dict, list]:
        if x.dtype == np.float64:  # cast directly: via float32 could round twice
            return {}, [x.astype(np.float16).view(np.uint16)]
        bits = np.empty(x.shape[0], np.uint16)
        fp16.to_half_bits(x, bits)
        return {}, [bits]

    def _encode_feedback(self, g: np.ndarray, e: np.ndarray, lam: float, e_out: np.ndarray,
                         key: int, round: int, reuse: Buffers | None) -> tuple[dict, list]:
        bits = reusable(reuse, 0, g.shape[0], np.uint16)
        if not fp16.encode_feedback(g, e, lam, bits, e_out):
            raise FeedbackRefused(self.name)
        return {}, [bits]

    def _encode_device_feedback(self, g: Any, e: Any, lam: float, e_out: Any, key: int,
                                round: int, reuse: Buffers | None) -> tuple[dict, list]:
        from gradpress.kernels.cuda import fp16 as gpu_fp16
        bits = gpu_fp16.encode_feedback(g, e, lam, e_out, reuse)
        if bits is None:
            raise FeedbackRefused(self.name)
        return {}, [bits]

    def encode_device_partitions(self, g: Any, e: Any, lam: float, e_out: Any, part: int, reuse: Any,
                                 keys: list, rounds: list) -> tuple[list, Any]:
        """``_encode_device_feedback`` of each ``part`` elements of g at once (a tensor's
        partitions, by ``ErrorFeedback.compress_partitions``): per partition (fields,
        buffers) or None where refused, and the host array they live in."""
        from gradpress.kernels.cuda import fp16 as gpu_fp16
        encoded, host = gpu_fp16.encode_feedback_segments(g, e, lam, e_out, part, reuse)
        return [None if bits is None else ({}, [bits]) for bits in encoded], host

    def _encode_device(self, x: Any, key: int, round: int) -> tuple[dict, list]:
        from gradpress.kernels.cuda import fp16 as gpu_fp16
        return {}, [gpu_fp16.to_half_bits(x)]

    def _decode(self, header: dict, buffers: Sequence[Any], out: np.ndarray, accumulate: bool,
                key: int, round: int, divisor: int = 1) -> None:
        expect_buffer_count(buffers, 1)
        bits = buffer_array(buffers, 0, np.uint16, out.shape[0], "fp16 values")
        fp16.from_half_bits(bits, out, accumulate)
        divide_in_place(out, divisor)

    def _decode_device(self, header: dict, buffers: Sequence[Any], out: Any, key: int, round: int,
                       divisor: int) -> bool:
        from gradpress.kernels.cuda import fp16 as gpu_fp16
        expect_buffer_count(buffers, 1)
        gpu_fp16.decode(buffer_array(buffers, 0, np.uint16, out.shape[0], "fp16 values"), divisor, out)
        return True
