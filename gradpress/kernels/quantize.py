"""Stochastic rounding of one magnitude onto dithering levels: plain Python compiled
unchanged for the CPU (``@njit``) and the GPU (``cuda.jit(device=True)``), so both
choose the same level for the same input and random draw.

Levels are ``0..s``. Linear: level ``l`` stands for ``l / s``. Natural: level 0 is 0 and
level ``l >= 1`` stands for ``2 ** (l - s)``. Every step is exact or a single correctly
rounded operation with no multiply feeding an add, so no FMA contraction can differ.
"""
import math

import numpy as np
from numba import njit


def level_py(magnitude, norm, s, natural, u):
    """Level (0..s) of ``magnitude`` in ``[0, norm]``, rounded up with the probability that
    makes it unbiased; ``u`` is uniform in ``[0, 1)``; ``norm > 0``."""
    if natural:
        t = magnitude / norm
        if t == 0.0:
            return 0
        mantissa, exponent = math.frexp(t)  # t = mantissa * 2**exponent, mantissa in [0.5, 1)
        if exponent >= 2 - s:
            low = s - 1 + exponent
            up = 2.0 * mantissa - 1.0  # (t - 2**(e-1)) / 2**(e-1), exact
        else:
            low = 0
            up = math.ldexp(t, s - 1)  # t / 2**(1-s), exact
    else:
        y = (magnitude * s) / norm  # product exact for float32 magnitudes, y <= s
        low = int(math.floor(y))
        up = y - low  # exact
    return low + 1 if u < up else low


def level_value_py(level, norm, s, natural):
    """The magnitude level ``level`` stands for, in float64."""
    if level == 0:
        return 0.0
    if natural:
        return math.ldexp(norm, level - s)
    return (norm * level) / s


level = njit(inline="always", nogil=True, cache=True)(level_py)
level_value = njit(nogil=True, cache=True)(level_value_py)


@njit(nogil=True, cache=True)
def code_table(norm: np.float32, s: int, natural: bool, width: int) -> np.ndarray:
    """Decoded float32 value of every ``width``-bit code (sign in the top bit)."""
    table = np.zeros(1 << width, np.float32)
    sign_bit = 1 << (width - 1)
    for lv in range(min(s + 1, sign_bit)):
        value = np.float32(level_value(lv, np.float64(norm), s, natural))
        table[lv] = value
        table[lv | sign_bit] = -value
    return table
