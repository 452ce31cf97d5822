"""CPU kernels of the fp16 codec, bit-exact with numpy's float16 casts."""
import numpy as np
from numba import njit

from gradpress.kernels.halfprec import float_to_half_bits, half_bits_to_float


@njit(nogil=True, cache=True)
def to_half_bits(x: np.ndarray, bits: np.ndarray) -> None:
    """``bits = x.astype(float16).view(uint16)`` for float32 ``x``."""
    for i in range(x.shape[0]):
        bits[i] = float_to_half_bits(x[i])


@njit(nogil=True, cache=True)
def from_half_bits(bits: np.ndarray, out: np.ndarray, accumulate: bool) -> None:
    """``out (+)= bits.view(float16).astype(float32)``."""
    for i in range(bits.shape[0]):
        if accumulate:
            out[i] += half_bits_to_float(bits[i])
        else:
            out[i] = half_bits_to_float(bits[i])
