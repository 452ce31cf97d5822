"""fp16 conversion loops (the only ones in gradpress), bit-exact with numpy's float16 casts.

Numba's CPU target has no float16, so half values travel as their uint16 bit patterns;
narrowing goes through the float's uint32 bits (the integer entry point vectorises).
Used by the fp16 codec, float16 inputs of every codec, and the server's fp16 sums.
"""
import numpy as np
from numba import njit

from gradpress.kernels.cpu.halfprec import float_bits_to_half_bits, half_bits_to_float


@njit(nogil=True, cache=True)
def _narrow(float_bits, bits):
    for i in range(float_bits.shape[0]):
        bits[i] = float_bits_to_half_bits(float_bits[i])


@njit(nogil=True, cache=True)
def _widen(bits, out):
    for i in range(bits.shape[0]):
        out[i] = half_bits_to_float(bits[i])


@njit(nogil=True, cache=True)
def _widen_add(bits, out):
    for i in range(bits.shape[0]):
        out[i] += half_bits_to_float(bits[i])


def to_half_bits(x: np.ndarray, bits: np.ndarray) -> None:
    """``bits = x.astype(float16).view(uint16)`` for contiguous float32 ``x``."""
    _narrow(x.view(np.uint32), bits)


def from_half_bits(bits: np.ndarray, out: np.ndarray, accumulate: bool = False) -> None:
    """``out (+)= bits.view(float16).astype(out.dtype)`` for a float32 or float64 ``out``."""
    (_widen_add if accumulate else _widen)(bits, out)
