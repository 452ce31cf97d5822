"""Numba kernels for the server's sums: copy or add a pushed buffer into the accumulator.

``nogil=True`` lets engine threads run them in parallel; they are serial on
purpose (Numba's workqueue layer aborts when parallel kernels are entered from
several threads at once). fp16 data arrives as its uint16 bit pattern because
Numba's CPU target has no float16.
"""
import numpy as np
from numba import njit

from ..kernels.halfprec import float_bits_to_half_bits, half_bits_to_float


@njit(nogil=True, cache=True)
def _store(acc, src):
    for i in range(acc.size):
        acc[i] = src[i]


@njit(nogil=True, cache=True)
def _add(acc, src):
    for i in range(acc.size):
        acc[i] += src[i]


@njit(nogil=True, cache=True)
def _store_half(acc, bits):
    for i in range(acc.size):
        acc[i] = half_bits_to_float(bits[i])


@njit(nogil=True, cache=True)
def _add_half(acc, bits):
    for i in range(acc.size):
        acc[i] += half_bits_to_float(bits[i])


@njit(nogil=True, cache=True)
def _to_half(acc_bits, bits):
    for i in range(acc_bits.size):
        bits[i] = float_bits_to_half_bits(acc_bits[i])


def accumulate(acc: np.ndarray, src: np.ndarray, first: bool) -> None:
    """``acc = src`` (first push of a round) or ``acc += src``, src of any wire dtype."""
    if src.dtype == np.float16:
        (_store_half if first else _add_half)(acc, src.view(np.uint16))
    else:
        (_store if first else _add)(acc, src)


def to_half(acc: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The fp32 accumulator rounded to float16 (into ``out`` if given), exactly as numpy's astype."""
    out = np.empty(acc.size, np.float16) if out is None else out
    _to_half(acc.view(np.uint32), out.view(np.uint16))
    return out
