"""Norms of float32 arrays in the summation order of ``kernels.reduction``.

A non-finite input makes the L1 and L2 sums non-finite and the abs-bits maximum at least
``INF_BITS``: that is how compressors detect NaN/inf without a separate pass.
"""
import numpy as np
from numba import njit

from gradpress.kernels.reduction import CHUNK, LANES, lane_tree, pairwise_total

INF_BITS = 0x7F800000


@njit(inline="always", nogil=True, cache=True)
def chunk_sum(x: np.ndarray, c: int, square: bool, lanes: np.ndarray) -> float:
    """Value of chunk ``c`` (sum of |x| or x^2); ``lanes`` is scratch of LANES float64."""
    n = x.shape[0]
    lanes[:] = 0.0
    base = c * CHUNK
    if base + CHUNK <= n:
        # full chunk: the fixed-trip inner loop is what LLVM vectorises
        for m in range(CHUNK // LANES):
            offset = base + m * LANES
            if square:
                for j in range(LANES):
                    v = np.float64(x[offset + j])
                    lanes[j] += v * v
            else:
                for j in range(LANES):
                    lanes[j] += abs(np.float64(x[offset + j]))
    else:
        for i in range(base, n):
            v = np.float64(x[i])
            lanes[(i - base) % LANES] += v * v if square else abs(v)
    return lane_tree(lanes)


@njit(nogil=True, cache=True)
def _chunk_sums(x: np.ndarray, square: bool) -> np.ndarray:
    values = np.empty((x.shape[0] + CHUNK - 1) // CHUNK)
    lanes = np.empty(LANES)
    for c in range(values.shape[0]):
        values[c] = chunk_sum(x, c, square, lanes)
    return values


@njit(nogil=True, cache=True)
def abs_sum(x: np.ndarray) -> float:
    """sum |x_i| in float64 (the L1 norm)."""
    return pairwise_total(_chunk_sums(x, False))


@njit(nogil=True, cache=True)
def square_sum(x: np.ndarray) -> float:
    """sum x_i^2 in float64 (the squared L2 norm)."""
    return pairwise_total(_chunk_sums(x, True))


@njit(nogil=True, cache=True)
def max_abs_bits(x: np.ndarray) -> int:
    """Largest ``|x_i|`` as float32 bits (order-free); >= INF_BITS iff a NaN/inf is present."""
    bits = x.view(np.uint32)
    best = np.uint32(0)
    for i in range(bits.shape[0]):
        best = max(best, bits[i] & np.uint32(0x7FFFFFFF))
    return best
