"""Scalars that CPU and CUDA encoders derive from their reductions, in one place so both
produce the same float32 bits: onebit's scale, dithering's norm, and the refusal of a
non-finite input (a NaN or inf anywhere makes the reduction non-finite). The ``*_py``
functions are plain Python that ``kernels/cuda`` compiles unchanged as device functions."""
import math

import numpy as np

from gradpress.errors import NonFiniteInput

SCALINGS = ("none", "l1", "l2")  # onebit's scalings; a kernel gets the index


def scale_py(scaling: int, n: int, abs_sum: float, square_sum: float) -> np.float32:
    """onebit's scale for ``SCALINGS[scaling]``: l1 = ||x||_1 / n, l2 = ||x||_2 / sqrt(n), else 1."""
    if scaling == 1:
        return np.float32(abs_sum / n)
    if scaling == 2:
        return np.float32(math.sqrt(square_sum / n))
    return np.float32(1.0)


def scale_from_norms(scaling: str, n: int, abs_sum: float, square_sum: float) -> np.float32:
    """onebit's float32 scale for the chosen norm."""
    return scale_py(SCALINGS.index(scaling), n, abs_sum, square_sum)


def l2_norm_py(square_sum: float) -> np.float32:
    return np.float32(math.sqrt(square_sum))


def norm_from(normalize: str, square_sum: float, max_bits: int) -> np.float32 | None:
    """dithering's float32 norm; |x_i| <= norm holds after rounding (rounding is monotone).
    None where it is not finite: an l2 norm of finite values may overflow float32."""
    if normalize != "l2":
        return np.array([max_bits], np.uint32).view(np.float32)[0]
    with np.errstate(over="ignore"):  # (the caller refuses it, without numpy's warning)
        norm = l2_norm_py(square_sum)
    return norm if np.isfinite(norm) else None


def reject_non_finite(total: float, codec: str = "onebit") -> None:
    """Raise ValueError when a reduction over the input came out NaN or inf."""
    if not math.isfinite(total):
        raise NonFiniteInput(f"{codec} input contains NaN or inf")
