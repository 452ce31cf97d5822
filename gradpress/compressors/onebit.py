"""``onebit``: scaled sign. D(C(x)) = s * sign(x) with sign(0) = +1; s = ||x||_1 / n with
``scaling`` (BytePS), ||x||_2 / sqrt(n) with ``scaling: l2`` (1-bit Adam), else 1.
Payload: [float32 scale (1)], [sign bits, 1 = negative (ceil(n/8) bytes)]."""
from typing import Any, Sequence

import numpy as np

from gradpress.compressors.arrays import as_float32, divided
from gradpress.compressors.base import Buffers, Compressor, FeedbackRefused, reusable
from gradpress.kernels.bitlayout import packed_nbytes
from gradpress.kernels.cpu import norms, onebit
from gradpress.kernels.scaling import SCALINGS, reject_non_finite, scale_from_norms
from gradpress.compressors.params import choice, flag
from gradpress.compressors.payload import buffer_array, expect_buffer_count, finite_scale
from gradpress.compressors.registry import register



@register
class OneBit(Compressor):
    name = "onebit"
    ACCEPTED_PARAMS = {"scaling": "true/l1 (||x||_1/n), l2 (||x||_2/sqrt(n)) or false (1)"}

    def __init__(self, scaling: str = "none") -> None:
        if scaling not in SCALINGS:
            raise ValueError(f"onebit scaling {scaling!r}; accepted: {', '.join(SCALINGS)}")
        self.scaling = scaling

    @classmethod
    def from_params(cls, params: dict) -> "OneBit":
        value = params.get("scaling", False)
        if isinstance(value, str) and value.lower() in ("l1", "l2"):
            return cls(choice(params, "scaling", ("l1", "l2"), None))
        return cls("l1" if flag(params, "scaling", False) else "none")

    def encoded_nbytes(self, n: int, itemsize: int) -> int:
        return 4 + packed_nbytes(n, 1)

    def _encode(self, x: np.ndarray, key: int, round: int) -> tuple[dict, list]:
        x = as_float32(x)
        n = x.shape[0]
        bits = np.empty(packed_nbytes(n, 1), np.uint8)
        # the L1 sum doubles as the NaN/inf check, so it is always computed
        l1 = norms.abs_sum(x)
        reject_non_finite(l1)
        onebit.pack_signs(x, bits)
        l2 = norms.square_sum(x) if self.scaling == "l2" else 0.0
        scale = np.array([scale_from_norms(self.scaling, n, l1, l2)], np.float32)
        return {}, [scale, bits]

    FEEDBACK_IN_PLACE = True  # pass 1 (the norm) checks p before pass 2 writes

    def _encode_feedback(self, g: np.ndarray, e: np.ndarray, lam: float, e_out: np.ndarray,
                         key: int, round: int, reuse: Buffers | None) -> tuple[dict, list]:
        bits = reusable(reuse, 1, packed_nbytes(g.shape[0], 1), np.uint8)
        scale = onebit.encode_feedback(g, e, lam, self.scaling, bits, e_out)
        if scale is None:
            raise FeedbackRefused(self.name)
        return {}, [np.array([scale], np.float32), bits]

    def _encode_device_feedback(self, g: Any, e: Any, lam: float, e_out: Any, key: int,
                                round: int, reuse: Buffers | None) -> tuple[dict, list]:
        from gradpress.kernels.cuda import onebit as gpu_onebit
        encoded = gpu_onebit.encode_feedback(g, e, lam, self.scaling, e_out, reuse)
        if encoded is None:
            raise FeedbackRefused(self.name)
        return encoded

    def encode_device_partitions(self, g: Any, e: Any, lam: float, e_out: Any, part: int, reuse: Any,
                                 keys: list, rounds: list) -> tuple[list, Any]:
        """``_encode_device_feedback`` of each ``part`` elements of g at once (a tensor's
        partitions, by ``ErrorFeedback.compress_partitions``): per partition (fields,
        buffers) or None where refused, and the host array they live in."""
        from gradpress.kernels.cuda import onebit as gpu_onebit
        return gpu_onebit.encode_feedback_segments(g, e, lam, self.scaling, e_out, part, reuse)

    def _encode_device(self, x: Any, key: int, round: int) -> tuple[dict, list]:
        from gradpress.kernels.cuda import onebit as gpu_onebit
        return gpu_onebit.encode(x, self.scaling)

    def _decode(self, header: dict, buffers: Sequence[Any], out: np.ndarray, accumulate: bool,
                key: int, round: int, divisor: int = 1) -> None:
        expect_buffer_count(buffers, 2)
        scale = buffer_array(buffers, 0, np.float32, 1, "onebit scale")[0]
        finite_scale(scale, "onebit scale")
        bits = buffer_array(buffers, 1, np.uint8, packed_nbytes(out.shape[0], 1), "sign bits")
        # +-scale / d is +-(scale / d) exactly: the scale is divided once
        onebit.unpack_signs(bits, divided(scale, divisor), out, accumulate)

    def _decode_device(self, header: dict, buffers: Sequence[Any], out: Any, key: int, round: int,
                       divisor: int) -> bool:
        from gradpress.kernels.cuda import onebit as gpu_onebit
        expect_buffer_count(buffers, 2)
        scale = buffer_array(buffers, 0, np.float32, 1, "onebit scale")[0]
        finite_scale(scale, "onebit scale")
        bits = buffer_array(buffers, 1, np.uint8, packed_nbytes(out.shape[0], 1), "sign bits")
        gpu_onebit.decode(bits, divided(scale, divisor), out)
        return True

    def __repr__(self) -> str:
        return f"OneBit(scaling={self.scaling!r})"
