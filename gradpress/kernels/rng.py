"""Counter-based random numbers that every node draws identically.

A stream is named by ``(seed, key, round)``; draw ``n`` of a stream is the splitmix64
output for state ``stream + (n + 1) * GOLDEN``. Only integer arithmetic modulo 2**64 is
used, so the same function runs unchanged in numpy (on uint64 arrays), in ``@njit`` code
and in numba.cuda device code: a GPU worker, a CPU server and the numpy reference draw the
same numbers without ever sending them.
"""
import numpy as np
from numba import njit

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_ONE = np.uint64(1)
_S27, _S30, _S31, _S32, _S40 = (np.uint64(n) for n in (27, 30, 31, 32, 40))
_MASK64 = (1 << 64) - 1
UNIT24 = 1.0 / (1 << 24)  # a 24-bit draw times this is exact in float32 and float64


def draw_bits_py(stream, counter):
    """Draw ``counter`` of ``stream`` as 64 random bits (uint64 scalars or arrays)."""
    z = stream + (counter + _ONE) * GOLDEN
    z = (z ^ (z >> _S30)) * _MUL1
    z = (z ^ (z >> _S27)) * _MUL2
    return z ^ (z >> _S31)


def below_py(bits, bound):
    """Map 64 random bits to ``[0, bound)`` (``bound <= 2**32``) by a 32x32-bit product."""
    return ((bits >> _S32) * bound) >> _S32


def uniform24_py(bits):
    """A uniform float64 in ``[0, 1)`` with 24 random bits (exact in float32 too)."""
    return np.float64(bits >> _S40) * UNIT24


draw_bits = njit(inline="always", nogil=True, cache=True)(draw_bits_py)
below = njit(inline="always", nogil=True, cache=True)(below_py)
uniform24 = njit(inline="always", nogil=True, cache=True)(uniform24_py)


def _mix64_int(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def stream_id(seed: int, key: int, round: int) -> np.uint64:
    """The stream of ``(seed, key, round)``: nested splitmix64 finalisers over the three."""
    z = _mix64_int((seed + 0x9E3779B97F4A7C15) & _MASK64)
    z = _mix64_int(z ^ (key & _MASK64))
    return np.uint64(_mix64_int(z ^ (round & _MASK64)))
