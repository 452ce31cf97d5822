"""IEEE binary16 <-> binary32 conversion inside Numba kernels.

Numba's CPU target has no float16 type, so fp16 data travels through kernels as
its uint16 bit pattern. The conversions are bit-exact with numpy's
``astype(np.float16)`` / ``astype(np.float32)`` (round to nearest, ties to even;
NaN stays NaN) and free of data-dependent loops, so LLVM vectorises the kernels
that call them (about 7x numpy's astype on this machine).

Where the CPU converts in hardware (x86 F16C: ``HARDWARE_HALF``), ``hardware_to_half`` and
``hardware_from_half`` are LLVM's own ``fptrunc``/``fpext`` to and from ``half``
(vcvtps2ph/vcvtph2ps, round to nearest even, exact widening): the same bits as the
functions below for every non-NaN input (checked over all 2**32 float32 patterns); a NaN
keeps its payload's top bits instead of becoming 0x7E00, so only callers that refuse NaN
(error feedback) use them.
"""
import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, types, uint16, uint32
from numba.core import config
from numba.extending import intrinsic

_HALF_BIAS_SHIFT = uint32(112 << 23)       # (127 - 15) << 23: re-bias the exponent
_MAGIC_SUBNORMAL = np.float32(2.0 ** -14)  # 113 << 23 as a float: renormalises subnormals


# No signature: an eager one loads numba's code generator at import (0.4 s of every process
# that imports gradpress.torch); callers pass uint16 and uint32, the types these are written for.
@njit(nogil=True, cache=True, inline="always")
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


@njit(nogil=True, cache=True, inline="always")
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


def _target_has_f16c() -> bool:
    """Whether the CPU numba compiles for has F16C (NUMBA_CPU_FEATURES, else this host's)."""
    features = config.CPU_FEATURES
    if features is None:
        llvm.initialize_native_target()
        features = llvm.get_host_cpu_features().flatten()
    return "+f16c" in features.split(",")


# without F16C LLVM would call a runtime helper numba may not link: never emit it there
HARDWARE_HALF = _target_has_f16c()


@intrinsic
def hardware_to_half(typingctx, x):
    """binary16 bits of float32 ``x`` rounded by the CPU (only when ``HARDWARE_HALF``)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return types.uint16(types.float32), codegen


@intrinsic
def hardware_from_half(typingctx, h):
    """float32 value of the binary16 bits ``h``, widened by the CPU (``HARDWARE_HALF``)."""
    if h != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen
