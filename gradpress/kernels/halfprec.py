"""IEEE binary16 <-> binary32 conversion inside Numba kernels.

Numba's CPU target has no float16 type, so fp16 data travels through kernels as
its uint16 bit pattern. The conversions are bit-exact with numpy's
``astype(np.float16)`` / ``astype(np.float32)`` (round to nearest, ties to even),
so a payload produced here is the payload numpy would produce.
"""
import numpy as np
from numba import njit, uint16, uint32, float32

_F32 = np.float32


@njit(float32(uint16), nogil=True, cache=True, inline="always")
def half_bits_to_float(h):
    """Value of the binary16 number whose bit pattern is ``h``."""
    sign = (uint32(h) & uint32(0x8000)) << uint32(16)
    exp = (uint32(h) >> uint32(10)) & uint32(0x1F)
    mant = uint32(h) & uint32(0x3FF)
    if exp == 0:
        # zero or subnormal: mant * 2^-24, exact in float32
        mag = _F32(mant) * _F32(5.9604644775390625e-08)
        return -mag if sign else mag
    if exp == 31:
        bits = sign | uint32(0x7F800000) | (mant << uint32(13))
    else:
        bits = sign | ((exp + uint32(112)) << uint32(23)) | (mant << uint32(13))
    return np.uint32(bits).view(np.float32)  # a scalar bit cast: no allocation


@njit(uint16(float32), nogil=True, cache=True, inline="always")
def float_to_half_bits(f):
    """Bit pattern of ``f`` rounded to binary16, ties to even (numpy's rule)."""
    x = np.float32(f).view(np.uint32)
    sign = (x >> uint32(16)) & uint32(0x8000)
    exp = (x >> uint32(23)) & uint32(0xFF)
    mant = x & uint32(0x7FFFFF)
    if exp == 255:  # inf or nan; keep nan a (quiet) nan
        if mant != 0:
            return uint16(sign | uint32(0x7E00))
        return uint16(sign | uint32(0x7C00))
    e = np.int32(exp) - np.int32(112)  # re-biased exponent
    if e >= 31:  # overflow to inf
        return uint16(sign | uint32(0x7C00))
    if e <= 0:  # subnormal half or zero
        if e < -10:
            return uint16(sign)
        m = mant | uint32(0x800000)
        shift = uint32(14 - e)
        half = m >> shift
        rem = m & ((uint32(1) << shift) - uint32(1))
        halfway = uint32(1) << (shift - uint32(1))
        if rem > halfway or (rem == halfway and (half & uint32(1))):
            half += uint32(1)
        return uint16(sign | half)
    half = sign | (uint32(e) << uint32(10)) | (mant >> uint32(13))
    rem = mant & uint32(0x1FFF)
    if rem > uint32(0x1000) or (rem == uint32(0x1000) and (half & uint32(1))):
        half += uint32(1)  # may carry into the exponent: still the right answer
    return uint16(half)
