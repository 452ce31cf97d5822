"""Numba kernels of low-rank compression (PowerSGD, ACP-SGD) on float32 matrices.

Layouts: a gradient M and its error buffer E are n x m (C order); the factor P is n x r and
the other factor is kept transposed, Qt = Q^T (r x m), so that every inner loop runs over
contiguous memory. Each kernel makes one pass over M and E a row at a time (the row stays in
cache): M + E, its product with a factor and the error update happen in that one pass,
where torch needs a pass (a read and a write of n x m floats) for each. Serial and
``nogil`` like every CPU kernel here.
"""
import numpy as np
from numba import njit

# a vector whose part orthogonal to the earlier ones is below this fraction of its norm is
# dependent on them up to float32 rounding: it becomes zero, not normalised rounding noise
DEPENDENT = 1e-4


# reassociation lets LLVM vectorise the row dot products; the order is fixed by the compiled
# code, so every worker (same code, same input) still gets the same bits
@njit(nogil=True, cache=True, fastmath={"reassoc"})
def factor_rows(m: np.ndarray, e: np.ndarray, qt: np.ndarray, p: np.ndarray, add_m: bool, subtract: bool) -> None:
    """P = X Q for X = E (+ M when ``add_m``); E becomes X - P Q^T when ``subtract``, else X.

    Args:
        m, e: n x m float32 (``m`` unread without ``add_m``); ``e`` is overwritten.
        qt: r x m, the factor Q transposed.
        p: n x r, receives X Q.
    """
    rows, cols = e.shape
    r = qt.shape[0]
    x = np.empty(cols, np.float32)
    for i in range(rows):
        if add_m:
            for j in range(cols):
                x[j] = m[i, j] + e[i, j]
        else:
            for j in range(cols):
                x[j] = e[i, j]
        for k in range(r):
            s = np.float32(0.0)
            for j in range(cols):
                s += x[j] * qt[k, j]
            p[i, k] = s
        if subtract:
            for k in range(r):
                c = p[i, k]
                for j in range(cols):
                    x[j] -= c * qt[k, j]
        for j in range(cols):
            e[i, j] = x[j]


@njit(nogil=True, cache=True)
def factor_cols(m: np.ndarray, e: np.ndarray, p: np.ndarray, qt: np.ndarray, add_m: bool) -> None:
    """Qt = (X^T P)^T = P^T X for X = E (+ M when ``add_m``); reads M and E, writes only ``qt`` (r x m)."""
    rows, cols = e.shape
    r = qt.shape[0]
    qt[:] = 0.0
    for i in range(rows):
        for k in range(r):
            c = p[i, k]
            if add_m:
                for j in range(cols):
                    qt[k, j] += c * (m[i, j] + e[i, j])
            else:
                for j in range(cols):
                    qt[k, j] += c * e[i, j]


@njit(nogil=True, cache=True)
def subtract_product(m: np.ndarray, e: np.ndarray, p: np.ndarray, qt: np.ndarray, add_m: bool) -> None:
    """E = X - P Q^T for X = E (+ M when ``add_m``)."""
    rows, cols = e.shape
    r = qt.shape[0]
    for i in range(rows):
        if add_m:
            for j in range(cols):
                e[i, j] += m[i, j]
        for k in range(r):
            c = p[i, k]
            for j in range(cols):
                e[i, j] -= c * qt[k, j]


@njit(nogil=True, cache=True)
def reconstruct(p: np.ndarray, qt: np.ndarray, scale: float, out: np.ndarray) -> None:
    """out = scale * P Q^T (n x m, r >= 1)."""
    rows, cols = out.shape
    r = qt.shape[0]
    s = np.float32(scale)
    for i in range(rows):
        c = p[i, 0] * s
        for j in range(cols):
            out[i, j] = c * qt[0, j]
        for k in range(1, r):
            c = p[i, k] * s
            for j in range(cols):
                out[i, j] += c * qt[k, j]


@njit(nogil=True, cache=True)
def orthonormalize(buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, ranks: np.ndarray,
                   by_rows: bool) -> None:
    """Modified Gram-Schmidt on each matrix of a flat float32 buffer, all in one call.

    Matrix t holds ``ranks[t]`` vectors of ``lengths[t]`` elements from ``offsets[t]``: element
    i of vector k is at ``k * length + i`` when ``by_rows`` (Qt, r x m) and ``i * r + k``
    otherwise (P, n x r). Dots and norms accumulate in float64. A vector that is zero, or
    that the earlier ones span (the matrix is rank-deficient, ``DEPENDENT``), becomes zero
    rather than being divided by (nearly) zero, so nothing turns NaN or noise; its factor then
    contributes nothing to the reconstruction and error feedback keeps what it missed.
    """
    for t in range(offsets.shape[0]):
        base, n, r = offsets[t], lengths[t], ranks[t]
        step = 1 if by_rows else r
        for k in range(r):
            vk = base + (k * n if by_rows else k)
            before = 0.0
            for i in range(n):
                v = np.float64(buf[vk + i * step])
                before += v * v
            for prev in range(k):
                vp = base + (prev * n if by_rows else prev)
                dot = 0.0
                for i in range(n):
                    dot += np.float64(buf[vk + i * step]) * np.float64(buf[vp + i * step])
                c = np.float32(dot)
                for i in range(n):
                    buf[vk + i * step] -= c * buf[vp + i * step]
            norm = 0.0
            for i in range(n):
                v = np.float64(buf[vk + i * step])
                norm += v * v
            norm = np.sqrt(norm)
            if norm == 0.0 or norm <= DEPENDENT * np.sqrt(before):
                for i in range(n):
                    buf[vk + i * step] = 0.0
            else:  # (a NaN stays NaN: it is the gradient's, not the method's)
                inv = np.float32(1.0 / norm)
                for i in range(n):
                    buf[vk + i * step] *= inv
