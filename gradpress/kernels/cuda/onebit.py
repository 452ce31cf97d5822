"""onebit encoder on the GPU, bare and with error feedback fused in: one thread per
output byte."""
import math

import numpy as np
from numba import cuda

from gradpress.kernels.bitlayout import packed_nbytes
from gradpress.kernels.cuda import norms
from gradpress.kernels.cuda.device import THREADS, blocks
from gradpress.kernels.scaling import reject_non_finite, scale_from_norms


@cuda.jit
def _pack_signs(x, bits):
    b = cuda.grid(1)
    if b >= bits.shape[0]:
        return
    byte = 0
    for j in range(8):
        i = 8 * b + j
        if i < x.shape[0] and x[i] < 0:
            byte |= 1 << j
    bits[b] = byte


def encode(x, scaling: str) -> tuple[dict, list]:
    n = x.shape[0]
    l1 = norms.abs_sum(x)
    reject_non_finite(l1)
    l2 = norms.square_sum(x) if scaling == "l2" else 0.0
    bits = cuda.device_array(packed_nbytes(n, 1), np.uint8)
    _pack_signs[blocks(bits.shape[0]), THREADS](x, bits)
    scale = np.array([scale_from_norms(scaling, n, l1, l2)], np.float32)
    return {}, [scale, bits.copy_to_host()]


@cuda.jit
def _pack_feedback(g, e, lam, scale, bits, e_out):
    """Pass 2: sign bits of p = g + lam * e and e_out = p - D(c); a thread reads e and
    writes e_out only at its own 8 elements, so e_out may be e."""
    b = cuda.grid(1)
    if b >= bits.shape[0]:
        return
    byte = 0
    for j in range(8):
        i = 8 * b + j
        if i < g.shape[0]:
            p = g[i] + lam * e[i]
            if p < 0:
                byte |= 1 << j
                e_out[i] = p - (-scale)
            else:
                e_out[i] = p - scale
    bits[b] = byte


def encode_feedback(g, e, lam: float, scaling: str, e_out) -> tuple[dict, list] | None:
    """Error feedback fused into onebit on the GPU: pass 1 the norm of p (the NaN/inf
    check), pass 2 the signs and the residual. None (nothing written) for a non-finite p."""
    n = g.shape[0]
    lam = np.float32(lam)
    l1 = norms.feedback_sum(g, e, lam, False)
    if not math.isfinite(l1):
        return None
    l2 = norms.feedback_sum(g, e, lam, True) if scaling == "l2" else 0.0
    scale = scale_from_norms(scaling, n, l1, l2)
    bits = cuda.device_array(packed_nbytes(n, 1), np.uint8)
    _pack_feedback[blocks(bits.shape[0]), THREADS](g, e, lam, scale, bits, e_out)
    return {}, [np.array([scale], np.float32), bits.copy_to_host()]


@cuda.jit
def _unpack_signs(bits, scale, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = -scale if (bits[i >> 3] >> (i & 7)) & 1 else scale


def decode(bits: np.ndarray, scale: np.float32, out) -> None:
    """``out[i] = -scale`` where sign bit i is set, else ``scale``, on the device: the
    payload goes over at its own size (n/8 bytes), never as n floats."""
    _unpack_signs[blocks(out.shape[0]), THREADS](cuda.to_device(bits), np.float32(scale), out)
