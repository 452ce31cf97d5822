"""``dithering`` (natural compression, arXiv 1905.10988): |x_i| / norm is rounded at
random to one of s+1 levels (linear: l/s; natural: 0 and powers of two 2^(l-s)) with the
probability that makes it unbiased; random draw i of stream (seed, key, round) decides.
Payload: [float32 norm (1)], [codes of ``width`` bits: level | sign << (width-1)];
header ``s``, ``partition``. width = 2 (s = 1), 4 (s <= 7) or 8 (s <= 127)."""
import math
from typing import Any, Sequence

import numpy as np

from gradpress.compressors.arrays import as_float32, divided
from gradpress.compressors.base import Buffers, Compressor, FeedbackRefused, reusable
from gradpress.kernels.bitlayout import packed_nbytes
from gradpress.kernels.cpu import dithering, norms
from gradpress.kernels.quantize import code_table
from gradpress.kernels.rng import stream_id
from gradpress.kernels.scaling import norm_from
from gradpress.compressors.params import choice, number
from gradpress.compressors.payload import (
    buffer_array, expect_buffer_count, finite_scale, header_choice, header_int)
from gradpress.compressors.registry import register
from gradpress.errors import NonFiniteInput

PARTITIONS = ("linear", "natural")
NORMALIZATIONS = ("max", "l2")
MAX_LEVELS = 127


def code_width(s: int) -> int:
    """Bits per code: sign + level, rounded up to 2, 4 or 8 so codes never straddle bytes."""
    bits = 1 + math.ceil(math.log2(s + 1))
    return next(width for width in (2, 4, 8) if width >= bits)


@register
class Dithering(Compressor):
    name = "dithering"
    ACCEPTED_PARAMS = {"s": f"levels, 1..{MAX_LEVELS} (7); BytePS's k is read when s is absent",
                       "k": "BytePS's name for s",
                       "partition": "linear | natural (linear)",
                       "normalize": "max | l2 (max)",
                       "seed": "random stream seed shared by all nodes (0)"}

    def __init__(self, s: int = 7, partition: str = "linear", normalize: str = "max",
                 seed: int = 0) -> None:
        self.s, self.partition, self.normalize, self.seed = s, partition, normalize, seed
        self.width = code_width(s)

    @classmethod
    def from_params(cls, params: dict) -> "Dithering":
        if "s" in params and "k" in params and params["s"] != params["k"]:  # (one would be dropped unread)
            raise ValueError(f"dithering: both s={params['s']!r} and k={params['k']!r} (BytePS's name for s) are "
                             f"given; give one")
        name = "s" if "s" in params or "k" not in params else "k"
        return cls(number(params, name, 7, 1, MAX_LEVELS, integer=True),
                   choice(params, "partition", PARTITIONS, "linear"),
                   choice(params, "normalize", NORMALIZATIONS, "max"),
                   number(params, "seed", 0, 0, 2 ** 63 - 1, integer=True))

    def encoded_nbytes(self, n: int, itemsize: int) -> int:
        return 4 + packed_nbytes(n, self.width)

    def _encode(self, x: np.ndarray, key: int, round: int) -> tuple[dict, list]:
        x = as_float32(x)
        max_bits = norms.max_abs_bits(x)
        if max_bits >= norms.INF_BITS:
            raise NonFiniteInput("dithering input contains NaN or inf")
        square_sum = norms.square_sum(x) if self.normalize == "l2" else 0.0
        norm = norm_from(self.normalize, square_sum, max_bits)
        if norm is None:  # finite values whose l2 norm overflows float32
            raise NonFiniteInput("dithering: the l2 norm of its input overflows float32")
        codes = np.empty(packed_nbytes(x.shape[0], self.width), np.uint8)
        dithering.encode(x, norm, self.s, self.partition == "natural", self.width,
                         stream_id(self.seed, key, round), codes)
        return self._fields(), [np.array([norm], np.float32), codes]

    FEEDBACK_IN_PLACE = True  # pass 1 (the norm) checks p before pass 2 writes

    def _encode_feedback(self, g: np.ndarray, e: np.ndarray, lam: float, e_out: np.ndarray,
                         key: int, round: int, reuse: Buffers | None) -> tuple[dict, list]:
        codes = reusable(reuse, 1, packed_nbytes(g.shape[0], self.width), np.uint8)
        norm = dithering.encode_feedback(g, e, lam, self.s, self.partition == "natural",
                                         self.normalize, self.width,
                                         stream_id(self.seed, key, round), codes, e_out)
        if norm is None:
            raise FeedbackRefused(self.name)
        return self._fields(), [np.array([norm], np.float32), codes]

    def _encode_device_feedback(self, g: Any, e: Any, lam: float, e_out: Any, key: int,
                                round: int, reuse: Buffers | None) -> tuple[dict, list]:
        from gradpress.kernels.cuda import dithering as gpu_dithering
        buffers = gpu_dithering.encode_feedback(g, e, lam, self, stream_id(self.seed, key, round),
                                                e_out, reuse)
        if buffers is None:
            raise FeedbackRefused(self.name)
        return self._fields(), buffers

    def encode_device_partitions(self, g: Any, e: Any, lam: float, e_out: Any, part: int, reuse: Any,
                                 keys: list, rounds: list) -> tuple[list, Any]:
        """``_encode_device_feedback`` of each ``part`` elements of g at once (a tensor's
        partitions, by ``ErrorFeedback.compress_partitions``), partition i drawing from the
        stream of ``keys[i]`` in ``rounds[i]``: per partition (fields, buffers) or None
        where refused, and the host array they live in."""
        from gradpress.kernels.cuda import dithering as gpu_dithering
        draws = [stream_id(self.seed, key, r) for key, r in zip(keys, rounds)]
        encoded, host = gpu_dithering.encode_feedback_segments(g, e, lam, self, draws, e_out, part, reuse)
        return [None if buffers is None else (self._fields(), buffers) for buffers in encoded], host

    def _encode_device(self, x: Any, key: int, round: int) -> tuple[dict, list]:
        from gradpress.kernels.cuda import dithering as gpu_dithering
        return self._fields(), gpu_dithering.encode(x, self, stream_id(self.seed, key, round))

    def _fields(self) -> dict:
        return {"s": self.s, "partition": self.partition}

    def _decode(self, header: dict, buffers: Sequence[Any], out: np.ndarray, accumulate: bool,
                key: int, round: int, divisor: int = 1) -> None:
        codes, table, width = self._sent(header, buffers, out.shape[0], divisor)
        dithering.decode(codes, table, width, out, accumulate)

    def _decode_device(self, header: dict, buffers: Sequence[Any], out: Any, key: int, round: int,
                       divisor: int) -> bool:
        from gradpress.kernels.cuda import decode
        codes, table, width = self._sent(header, buffers, out.shape[0], divisor)
        decode.lookup(codes, table, width, out)
        return True

    @staticmethod
    def _sent(header: dict, buffers: Sequence[Any], n: int, divisor: int) -> tuple[np.ndarray, np.ndarray, int]:
        """The payload's codes, its level table divided by ``divisor`` (each value once) and the
        code width, checked (ValueError for codes past ``s`` or non-zero padding)."""
        s = header_int(header, "s", 1, MAX_LEVELS)
        natural = header_choice(header, "partition", PARTITIONS) == "natural"
        width = code_width(s)
        expect_buffer_count(buffers, 2)
        norm = buffer_array(buffers, 0, np.float32, 1, "dithering norm")[0]
        finite_scale(norm, "dithering norm")
        codes = buffer_array(buffers, 1, np.uint8, packed_nbytes(n, width), "codes")
        if not dithering.codes_within(codes, s, width, n):
            raise ValueError(f"payload codes exceed s={s} levels or have non-zero padding")
        return codes, divided(code_table(norm, s, natural, width), divisor), width

    def __repr__(self) -> str:
        return (f"Dithering(s={self.s}, partition={self.partition!r}, "
                f"normalize={self.normalize!r}, seed={self.seed})")
