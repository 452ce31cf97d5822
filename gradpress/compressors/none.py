"""``none``: the array travels as it is (its own dtype, zero-copy). NaN and inf pass
through unchanged."""
from typing import Any, Sequence

import numpy as np

from gradpress.compressors.base import Compressor, raw_payload
from gradpress.compressors.registry import register


@register
class NoCompression(Compressor):
    name = "none"

    @classmethod
    def from_params(cls, params: dict) -> "NoCompression":
        return cls()

    def encoded_nbytes(self, n: int, itemsize: int) -> int:
        return n * itemsize  # equal to the raw size, so Compressor always sends it raw

    def _encode(self, x: np.ndarray, key: int, round: int) -> tuple[dict, list]:
        return raw_payload(x)

    def _encode_device(self, x: Any, key: int, round: int) -> tuple[dict, list]:
        from gradpress.kernels.cuda import device
        return raw_payload(device.to_host(x))

    def _decode(self, header: dict, buffers: Sequence[Any], out: np.ndarray, accumulate: bool,
                key: int, round: int, divisor: int = 1) -> None:
        raise ValueError("a 'none' payload must carry the header field 'raw'")
