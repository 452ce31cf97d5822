"""Scatter of (index, value) pairs, the decoder shared by top-k and random-k."""
import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def scatter(indices: np.ndarray, values: np.ndarray, out: np.ndarray, accumulate: bool) -> None:
    """``out[indices] (+)= values``; without ``accumulate`` every other entry becomes 0."""
    if not accumulate:
        out[:] = 0.0
    for j in range(indices.shape[0]):
        if accumulate:
            out[indices[j]] += values[j]
        else:
            out[indices[j]] = values[j]


@njit(nogil=True, cache=True)
def strictly_increasing_below(indices: np.ndarray, bound: int) -> bool:
    """Whether indices are strictly increasing and all below ``bound`` (payload check)."""
    previous = -1
    for j in range(indices.shape[0]):
        index = np.int64(indices[j])
        if index <= previous:
            return False
        previous = index
    return previous < bound
