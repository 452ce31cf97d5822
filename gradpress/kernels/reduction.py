"""The one summation order for norms, so that CPU, GPU and numpy agree bit for bit.

Elements are cut into chunks of ``CHUNK`` = 4096; inside a chunk, lane ``j`` (0..63) adds
elements ``j, j+64, j+128, ...`` in increasing order, in float64, from +0.0 (a missing
tail element counts as +0.0). A chunk's value is the pairwise tree of its 64 lanes
(``a[j] = a[2j] + a[2j+1]`` level by level); the total is the same level-by-level pairing
over the chunk values, an odd last value passing up unchanged. Squares of float32
values are exact in float64, so a fused multiply-add on the GPU cannot change a bit.
64 lanes is also what lets LLVM vectorise the CPU loop at memory speed.
"""
import numpy as np
from numba import njit

CHUNK = 4096
LANES = 64


@njit(inline="always", nogil=True, cache=True)
def lane_tree(lanes: np.ndarray) -> float:
    """Pairwise tree over 64 lane sums (overwrites ``lanes``)."""
    width = LANES
    while width > 1:
        width //= 2
        for j in range(width):
            lanes[j] = lanes[2 * j] + lanes[2 * j + 1]
    return lanes[0]


@njit(nogil=True, cache=True)
def pairwise_total(values: np.ndarray) -> float:
    """Level-by-level pairwise sum of ``values`` (overwrites it); 0.0 when empty."""
    n = values.shape[0]
    if n == 0:
        return 0.0
    while n > 1:
        half = n // 2
        for j in range(half):
            values[j] = values[2 * j] + values[2 * j + 1]
        if n % 2:
            values[half] = values[n - 1]
            n = half + 1
        else:
            n = half
    return values[0]


@njit(nogil=True, cache=True)
def finish_lane_sums(lane_sums: np.ndarray) -> float:
    """Total from per-(chunk, lane) sums laid out chunk-major, as the GPU produces them."""
    chunks = lane_sums.shape[0] // LANES
    chunk_values = np.empty(chunks)
    lanes = np.empty(LANES)
    for c in range(chunks):
        lanes[:] = lane_sums[c * LANES:(c + 1) * LANES]
        chunk_values[c] = lane_tree(lanes)
    return pairwise_total(chunk_values)


def chunk_count(n: int) -> int:
    return (n + CHUNK - 1) // CHUNK
