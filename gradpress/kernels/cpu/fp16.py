"""fp16 conversion loops (the only ones in gradpress), bit-exact with numpy's float16 casts.

Numba's CPU target has no float16, so half values travel as their uint16 bit patterns;
narrowing goes through the float's uint32 bits (the integer entry point vectorises).
Used by the fp16 codec (with error feedback fused in: ``encode_feedback``), float16 inputs
of every codec, and the server's fp16 sums.
"""
import numpy as np
from numba import njit

from gradpress.kernels.cpu.halfprec import (
    HARDWARE_HALF, float_bits_to_half_bits, half_bits_to_float, hardware_from_half,
    hardware_to_half)


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


@njit(nogil=True, cache=True)
def _widen_hardware(bits, out):
    for i in range(bits.shape[0]):
        out[i] = hardware_from_half(bits[i])


@njit(nogil=True, cache=True)
def _widen_add_hardware(bits, out):
    for i in range(bits.shape[0]):
        out[i] += hardware_from_half(bits[i])


@njit(nogil=True, cache=True)
def _narrow_hardware(x, bits):
    for i in range(x.shape[0]):
        bits[i] = hardware_to_half(x[i])


def to_half_bits(x: np.ndarray, bits: np.ndarray) -> None:
    """``bits = x.astype(float16).view(uint16)`` for contiguous float32 ``x``."""
    _narrow(x.view(np.uint32), bits)


def from_half_bits(bits: np.ndarray, out: np.ndarray, accumulate: bool = False) -> None:
    """``out (+)= bits.view(float16).astype(out.dtype)`` for a float32 or float64 ``out``."""
    (_widen_add if accumulate else _widen)(bits, out)


def sum_half_bits(bits: np.ndarray, acc: np.ndarray, first: bool) -> None:
    """A sum's step: ``acc (+)= bits.view(float16)`` for a float32 (or float64) ``acc``, with the CPU's
    conversions where it has them (about 3x the software loop's speed, which made a
    float16 sum 2.8x slower per element than a float32 one on this host). Finite values
    give numpy's bits; a NaN stays NaN, its payload possibly not numpy's."""
    if HARDWARE_HALF:
        (_widen_hardware if first else _widen_add_hardware)(bits, acc)
    else:
        from_half_bits(bits, acc, accumulate=not first)


def round_half_bits(acc: np.ndarray, bits: np.ndarray) -> None:
    """A sum's result: ``bits = acc.astype(float16).view(uint16)`` for contiguous float32
    ``acc``, as ``sum_half_bits`` (numpy's bits for everything but a NaN's payload)."""
    if HARDWARE_HALF:
        _narrow_hardware(acc, bits)
    else:
        to_half_bits(acc, bits)


_HALF_ABS = np.uint16(0x7FFF)
_HALF_INF = np.uint16(0x7C00)


@njit(inline="always", nogil=True, cache=True)
def _p(g: np.ndarray, e: np.ndarray, lam: float, i: int) -> np.float32:
    """p_i = g_i + lam * e_i as ``elementwise.compensate`` rounds it."""
    if lam == 1.0:
        return g[i] + e[i]
    return np.float32(g[i] + lam * e[i])


@njit(nogil=True, cache=True)
def _feedback_software(g, e, lam, bits, e_out):
    largest = np.uint16(0)
    for i in range(g.shape[0]):
        p = _p(g, e, lam, i)
        half = float_bits_to_half_bits(np.float32(p).view(np.uint32))
        bits[i] = half
        e_out[i] = p - half_bits_to_float(half)
        largest = max(largest, half & _HALF_ABS)
    return largest < _HALF_INF


@njit(nogil=True, cache=True)
def _feedback_hardware(g, e, lam, bits, e_out):
    largest = np.uint16(0)
    for i in range(g.shape[0]):
        p = _p(g, e, lam, i)
        half = hardware_to_half(p)
        bits[i] = half
        e_out[i] = p - hardware_from_half(half)
        largest = max(largest, half & _HALF_ABS)
    return largest < _HALF_INF


def encode_feedback(g: np.ndarray, e: np.ndarray, lam: float, bits: np.ndarray,
                    e_out: np.ndarray) -> bool:
    """Error feedback fused into fp16, one loop over the arrays: p = g + lam * e;
    bits = half(p); e_out = p - float(half(p)). False when a residual is not finite: a
    residual is finite iff half(p) is (NaN/inf in g or e, or p beyond fp16's range, give
    a half with all exponent bits set), so the check is an integer max of the halves,
    which vectorises with the rest (in-cache blocks with separate loops measured 2.8 GB/s
    of g, one loop with the CPU's F16C conversions 8 GB/s). ``e_out`` then holds garbage
    and must not alias ``e``. The CPU's conversions give the same bits as the software
    ones for everything but NaN, which is refused here anyway."""
    kernel = _feedback_hardware if HARDWARE_HALF else _feedback_software
    return kernel(g, e, lam, bits, e_out)


@njit(nogil=True, cache=True)
def _divide_software(bits, divisor, out_bits):
    for i in range(bits.shape[0]):
        out_bits[i] = float_bits_to_half_bits(np.float32(half_bits_to_float(bits[i]) / divisor).view(np.uint32))


@njit(nogil=True, cache=True)
def _divide_hardware(bits, reciprocal, out_bits):
    """x * (1 / d) in float64, then float32, then float16: the same bits as float32's x / d
    (an 11-bit x over a d of at most 11 bits is never within float64's error of a float32
    rounding boundary, nor on one; checked for every half and every d up to 2048). A
    multiply instead of a division: the division was most of the average's time."""
    for i in range(bits.shape[0]):
        out_bits[i] = hardware_to_half(np.float32(np.float64(hardware_from_half(bits[i])) * reciprocal))


def divide_half(x: np.ndarray, divisor: int, out: np.ndarray) -> None:
    """``np.divide(x, divisor, out=out)`` for float16 ``x`` and ``out`` (contiguous, same size):
    in float32, rounded once, bit for bit what numpy gives (for divisors up to 2048, which
    numpy rounds to float16 first), without numpy's scalar half loop (12x slower than
    float32's). NaN stays NaN (its payload may differ from numpy's)."""
    if HARDWARE_HALF:
        _divide_hardware(x.view(np.uint16), 1.0 / float(divisor), out.view(np.uint16))
    else:
        _divide_software(x.view(np.uint16), np.float32(divisor), out.view(np.uint16))
