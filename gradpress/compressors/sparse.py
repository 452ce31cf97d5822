"""What top-k and random-k share: keeping ``k`` of ``n`` elements (BytePS's ``k``),
the finiteness check, and decoding (index, value) pairs."""
from typing import Any, Sequence

import numpy as np

from gradpress.kernels.cpu import norms, sparse
from gradpress.compressors.params import fraction_or_count
from gradpress.compressors.payload import buffer_array
from gradpress.errors import NonFiniteInput


def k_from_params(params: dict) -> float:
    return fraction_or_count(params, "k", 0.01)


def reject_non_finite(x32: np.ndarray, codec: str) -> None:
    if norms.max_abs_bits(x32) >= norms.INF_BITS:
        raise NonFiniteInput(f"{codec} input contains NaN or inf")


def decode_pairs(indices: np.ndarray, values: np.ndarray, out: np.ndarray,
                 accumulate: bool) -> None:
    """Scatter pairs after checking the indices are increasing and in range."""
    sparse.scatter(checked_indices(indices, out.shape[0]), values, out, accumulate)


def checked_indices(indices: np.ndarray, n: int) -> np.ndarray:
    """``indices`` if strictly increasing and below ``n`` (ValueError if not): what the
    device scatter may write at."""
    if not sparse.strictly_increasing_below(indices, n):
        raise ValueError("payload indices must be strictly increasing and below n")
    return indices


def values_buffer(buffers: Sequence[Any], position: int, count: int) -> np.ndarray:
    values = buffer_array(buffers, position, np.float32, count, "values")
    if norms.max_abs_bits(values) >= norms.INF_BITS:
        raise ValueError("payload values contain NaN or inf")
    return values
