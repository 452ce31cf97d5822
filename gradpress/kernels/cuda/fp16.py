"""fp16 encoder on the GPU: the hardware float32 -> float16 conversion rounds to nearest
even, as numpy does (NaN payload bits may differ)."""
import numpy as np
from numba import cuda

from gradpress.kernels.cuda.device import THREADS, blocks


@cuda.jit
def _to_half(x, half):
    i = cuda.grid(1)
    if i < x.shape[0]:
        half[i] = np.float16(x[i])


def to_half_bits(x) -> np.ndarray:
    half = cuda.device_array(x.shape[0], np.float16)
    _to_half[blocks(x.shape[0]), THREADS](x, half)
    return half.copy_to_host().view(np.uint16)


@cuda.jit
def _encode_feedback(g, e, lam, half, e_out, flag):
    i = cuda.grid(1)
    if i < g.shape[0]:
        p = g[i] + lam * e[i]
        h = np.float16(p)
        half[i] = h
        residual = p - np.float32(h)
        e_out[i] = residual
        if not abs(residual) < np.inf:
            cuda.atomic.max(flag, 0, 1)


def encode_feedback(g, e, lam: float, e_out) -> np.ndarray | None:
    """Error feedback fused into fp16, one pass: half(p) bits and e_out = p - float(half(p));
    None when a residual is not finite (e_out then holds garbage; it must not be e)."""
    half = cuda.device_array(g.shape[0], np.float16)
    flag = cuda.to_device(np.zeros(1, np.int32))
    _encode_feedback[blocks(g.shape[0]), THREADS](g, e, np.float32(lam), half, e_out, flag)
    if int(flag.copy_to_host()[0]):
        return None
    return half.copy_to_host().view(np.uint16)


@cuda.jit
def _widen_divided(half, divisor, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = np.float32(half[i]) / divisor


def decode(bits: np.ndarray, divisor: int, out) -> None:
    """``out = float32(half) / divisor`` on the device (a true float32 division, as the
    host decoder's), from the half-precision bits as they came: 2 bytes an element go over."""
    half = cuda.to_device(np.ascontiguousarray(bits).view(np.float16))
    _widen_divided[blocks(out.shape[0]), THREADS](half, np.float32(divisor), out)
