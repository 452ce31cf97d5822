"""The server's sums: copy or add a pushed buffer into the fp32 (or fp64) accumulator.

``nogil=True`` lets engine threads run them in parallel; they are serial on
purpose (Numba's workqueue layer aborts when parallel kernels are entered from
several threads at once). fp16 pushes arrive as uint16 bit patterns (``cpu/fp16.py``).
"""
import numpy as np
from numba import njit

from gradpress.kernels.cpu import fp16


@njit(nogil=True, cache=True)
def _store(acc, src):
    for i in range(acc.size):
        acc[i] = src[i]


@njit(nogil=True, cache=True)
def _add(acc, src):
    for i in range(acc.size):
        acc[i] += src[i]


@njit(nogil=True, cache=True)
def _pair(out, a, b):
    for i in range(out.size):
        out[i] = a[i] + b[i]


def sum_pair(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """``out = a + b`` in one pass, all three float32 (or all float64): the bits of
    ``accumulate(out, a, True)`` then ``accumulate(out, b, False)``, with one read of
    each input and one write instead of two of each."""
    if not out.dtype == a.dtype == b.dtype or out.dtype not in (np.float32, np.float64):
        raise TypeError(f"sum_pair takes float32 or float64 arrays of one dtype, not {out.dtype}, "
                        f"{a.dtype} and {b.dtype}")
    _pair(out, a, b)


def accumulate(acc: np.ndarray, src: np.ndarray, first: bool) -> None:
    """``acc = src`` (first push of a round) or ``acc += src``, src of any wire dtype."""
    if src.dtype == np.float16:
        fp16.sum_half_bits(src.view(np.uint16), acc, first)
    else:
        (_store if first else _add)(acc, src)


def to_half(acc: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The fp32 accumulator rounded to float16 (into ``out`` if given), as numpy's astype
    (a NaN's payload aside)."""
    out = np.empty(acc.size, np.float16) if out is None else out
    fp16.round_half_bits(acc, out.view(np.uint16))
    return out
