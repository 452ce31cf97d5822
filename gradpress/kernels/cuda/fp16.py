"""fp16 encoder on the GPU: the hardware float32 -> float16 conversion rounds to nearest
even, as numpy does (NaN payload bits may differ). One launch, one element per thread,
and one copy of the halves (with error feedback, a status word travels in the same copy)."""
import numpy as np
from numba import cuda

from gradpress.kernels.cuda import device, scratch, uploads
from gradpress.kernels.cuda.compensation import compensated
from gradpress.kernels.cuda.device import THREADS, blocks


@cuda.jit(cache=True)
def _to_half(x, half):
    i = cuda.grid(1)
    if i < x.shape[0]:
        half[i] = np.float16(x[i])


def to_half_bits(x) -> np.ndarray:
    """half(x) bits, in a pinned host buffer of the pool (``scratch.pooled_host``)."""
    layout = scratch.Layout(((np.float16, x.shape[0]),), 1)
    whole, (half,) = scratch.staged(layout)
    _to_half[blocks(x.shape[0]), THREADS, device.stream()](x, half)
    (bits,) = scratch.copy_back(whole, layout, scratch.pooled_host(layout.nbytes))
    return bits.view(np.uint16)


@cuda.jit(cache=True)
def _encode_feedback(g, e, lam, seg_len, half, e_out, flags, epoch):
    """half(p) and e_out = p - float(half(p)); flags[i // seg_len] = epoch where a residual
    is not finite (an earlier call's flag holds another epoch, so nothing clears it)."""
    i = cuda.grid(1)
    if i < g.shape[0]:
        p = compensated(g[i], lam, e[i])
        h = np.float16(p)
        half[i] = h
        residual = p - np.float32(h)
        e_out[i] = residual
        if not abs(residual) < np.inf:
            flags[i // seg_len] = epoch


def encode_feedback(g, e, lam: float, e_out, reuse=None) -> np.ndarray | None:
    """Error feedback fused into fp16, one pass: half(p) bits and e_out = p - float(half(p));
    None when a residual is not finite (e_out then holds garbage; it must not be e). The
    bits land in ``reuse``'s host buffer where it is this layout's."""
    layout = scratch.Layout(((np.float16, g.shape[0]), (np.int32, 1)), 1)
    whole, (half, flag) = scratch.staged(layout)
    epoch = scratch.epoch()
    _encode_feedback[blocks(g.shape[0]), THREADS, device.stream()](
        g, e, np.float64(lam), max(g.shape[0], 1), half, e_out, flag, epoch)
    bits, flag_host = scratch.copy_back(whole, layout, scratch.feedback_host(layout, reuse))
    return None if flag_host[0] == epoch else bits.view(np.uint16)


def encode_feedback_segments(g, e, lam: float, e_out, seg_len: int,
                             reuse: np.ndarray | None) -> tuple[list, np.ndarray]:
    """``encode_feedback`` of every segment of ``seg_len`` elements of g (a tensor's
    partitions) in one launch: per segment its bits, None where a residual is not finite
    (its part of e_out then holds garbage), and the pinned host array behind them (``reuse``
    where it fits: passed only once nobody reads it). The halves come back in one copy, the
    flags in a second (``scratch.copy_back_flagged``)."""
    n = g.shape[0]
    segments = -(-n // seg_len)
    layout = scratch.Layout(((np.float16, n),), 1)
    whole, (half,) = scratch.grown_staged("fp16-halves", layout)
    flags = scratch.zeroed((segments,), np.int32, "fp16-flags")
    epoch = scratch.epoch()
    _encode_feedback[blocks(n), THREADS, device.stream()](g, e, np.float64(lam), seg_len, half, e_out, flags, epoch)
    (bits,), flags_host, host = scratch.copy_back_flagged(whole, layout, flags, reuse)
    bits = bits.view(np.uint16)
    return [None if flags_host[s] == epoch else bits[s * seg_len:(s + 1) * seg_len]
            for s in range(segments)], host


@cuda.jit(cache=True)
def _widen_divided(half, divisor, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = np.float32(half[i]) / divisor


def decode(bits: np.ndarray, divisor: int, out) -> None:
    """``out = float32(half) / divisor`` on the device (a true float32 division, as the
    host decoder's), from the half-precision bits as they came: 2 bytes an element go over."""
    half = uploads.upload(np.ascontiguousarray(bits).view(np.float16), "fp16-half")
    _widen_divided[blocks(out.shape[0]), THREADS, device.stream()](half, np.float32(divisor), out)
