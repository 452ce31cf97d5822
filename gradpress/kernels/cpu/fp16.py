"""fp16 conversion loops (the only ones in gradpress), bit-exact with numpy's float16 casts.

Numba's CPU target has no float16, so half values travel as their uint16 bit patterns;
narrowing goes through the float's uint32 bits (the integer entry point vectorises).
Used by the fp16 codec (with error feedback fused in: ``encode_feedback``), float16 inputs
of every codec, and the server's fp16 sums.
"""
import numpy as np
from numba import njit

from gradpress.kernels.cpu.elementwise import compensate
from gradpress.kernels.cpu.norms import INF_BITS, max_abs_bits
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


@njit(nogil=True, cache=True)
def _residual(p, bits, e_out):
    for i in range(bits.shape[0]):
        e_out[i] = p[i] - half_bits_to_float(bits[i])


_BLOCK = 4096  # elements per in-cache block of the error-feedback pass


@njit(nogil=True, cache=True)
def encode_feedback(g: np.ndarray, e: np.ndarray, lam: float, bits: np.ndarray,
                    e_out: np.ndarray) -> bool:
    """Error feedback fused into fp16, one pass: p = g + lam * e; bits = half(p);
    e_out = p - float(half(p)). False when a residual is not finite (NaN/inf in g or e,
    or p beyond fp16's range); ``e_out`` then holds garbage and must not alias ``e``."""
    n = g.shape[0]
    largest = 0
    p = np.empty(_BLOCK, np.float32)
    for start in range(0, n, _BLOCK):
        end = min(start + _BLOCK, n)
        block = p[:end - start]
        compensate(g[start:end], e[start:end], lam, block)
        _narrow(block.view(np.uint32), bits[start:end])
        _residual(block, bits[start:end], e_out[start:end])
        largest = max(largest, max_abs_bits(e_out[start:end]))
    return largest < INF_BITS
