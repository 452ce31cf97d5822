"""onebit encoder on the GPU, bare and with error feedback fused in. Two launches and
one copy: the norms of p on the device (``norms.launch_totals``), then the scale (NaN
marks a non-finite input), the packed signs and the residual in one kernel that writes
nothing else where the scale is NaN; the payload, scale and bits in one allocation,
comes back in one copy."""
import numpy as np
from numba import cuda, uint8

from gradpress.kernels.bitlayout import packed_nbytes
from gradpress.kernels.cuda import device, norms, scratch, uploads
from gradpress.kernels.cuda.device import THREADS, blocks
from gradpress.kernels.cuda.packing import PACK_THREADS, STAGE, element, pack_blocks, pack_byte
from gradpress.kernels.scaling import SCALINGS, reject_non_finite, scale_py

_scale_of = cuda.jit(device=True)(scale_py)


@cuda.jit
def _pack(g, e, lam, feedback, totals, scaling, scale_out, bits, e_out):
    """The scale from the totals (``norms.launch_totals``) into scale_out[0], NaN where
    sum |p| is not finite, and then nothing else; else the sign bits of p (1 = negative)
    and, with ``feedback``, e_out = p - D(c). A thread reads e and writes e_out only at its
    own elements, so e_out may be e."""
    t = cuda.threadIdx.x
    block = cuda.blockIdx.x
    l1 = totals[norms.ABS]
    if not abs(l1) < np.inf:
        if t == 0 and block == 0:
            scale_out[0] = np.float32(np.nan)
        return
    s = _scale_of(scaling, g.shape[0], l1, totals[norms.SQUARE])
    if t == 0 and block == 0:
        scale_out[0] = s
    stage = cuda.shared.array(STAGE, uint8)
    for k in range(8):
        local, i = element(k, 8, t, block)
        sign = 0
        if i < g.shape[0]:
            p = norms.load(g, e, lam, feedback, i)
            if p < 0:
                sign = 1
            if feedback:
                e_out[i] = p - (-s if p < 0 else s)
        stage[local] = sign
    cuda.syncthreads()
    pack_byte(stage, 1, bits, t, block)


def _layout(n: int) -> scratch.Layout:
    return scratch.Layout(((np.float32, 1), (np.uint8, packed_nbytes(n, 1))), 2)


def _run(g, e, lam: np.float32, feedback: bool, scaling: str, e_out, host_of) -> list:
    """Queue the two kernels, copy the payload into ``host_of(layout)``, synchronise."""
    n = g.shape[0]
    layout = _layout(n)
    whole, (scale, bits) = scratch.staged(layout)
    totals = norms.launch_totals(g, e, lam, feedback)
    _pack[pack_blocks(bits.shape[0]), PACK_THREADS, device.stream()](
        g, e, lam, feedback, totals, SCALINGS.index(scaling), scale, bits, e_out)
    return scratch.copy_back(whole, layout, host_of(layout))


def encode(x, scaling: str) -> tuple[dict, list]:
    """Fields and [scale, sign bits] of ``x``; ValueError for a NaN or inf."""
    buffers = _run(x, x, np.float32(0), False, scaling, x, lambda layout: scratch.pooled_host(layout.nbytes))
    reject_non_finite(float(buffers[0][0]))
    return {}, buffers


def encode_feedback(g, e, lam: float, scaling: str, e_out, reuse=None) -> tuple[dict, list] | None:
    """Error feedback fused into onebit on the GPU: pass 1 the norms of p, pass 2 the signs
    and the residual. None (e_out untouched) for a non-finite p. The payload lands in
    ``reuse``'s host buffer where it is this layout's (see ``scratch.feedback_host``)."""
    buffers = _run(g, e, np.float32(lam), True, scaling, e_out,
                   lambda layout: scratch.feedback_host(layout, reuse))
    if not np.isfinite(buffers[0][0]):
        return None
    return {}, buffers


@cuda.jit
def _unpack_signs(bits, scale, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = -scale if (bits[i >> 3] >> (i & 7)) & 1 else scale


def decode(bits: np.ndarray, scale: np.float32, out) -> None:
    """``out[i] = -scale`` where sign bit i is set, else ``scale``, on the device: the
    payload goes over at its own size (n/8 bytes), never as n floats."""
    packed = uploads.upload(bits, "onebit-bits")
    _unpack_signs[blocks(out.shape[0]), THREADS, device.stream()](packed, np.float32(scale), out)
