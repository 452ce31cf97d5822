"""onebit encoder on the GPU, bare and with error feedback fused in. Two launches and
one copy: the norms of p on the device (``norms.launch_totals``), then the scale (NaN
marks a non-finite input), the packed signs and the residual in one kernel that writes
nothing else where the scale is NaN; the payload, scale and bits in one allocation,
comes back in one copy."""
import numpy as np
from numba import cuda, uint8

from gradpress.kernels.cuda import device, norms, scratch, uploads
from gradpress.kernels.cuda.device import THREADS, blocks
from gradpress.kernels.cuda.packing import (
    PACK_THREADS, STAGE, element, pack_byte, segment_block, segment_codes, segments_grid, staged_segments)
from gradpress.kernels.scaling import SCALINGS, reject_non_finite, scale_py

_scale_of = cuda.jit(device=True)(scale_py)


@cuda.jit(cache=True)
def _pack(g, e, lam, feedback, seg_len, seg_blocks, totals, scaling, scales, bits, e_out):
    """Per segment s of ``seg_len`` elements (the last one shorter), packed by the
    ``seg_blocks`` blocks from s * seg_blocks: its scale from its totals
    (``norms.launch_totals``) into scales[s], NaN where its sum |p| is not finite, and then
    nothing else; else its sign bits (1 = negative), from byte s * ceil(seg_len / 8) of
    ``bits``, and, with ``feedback``, e_out = p - D(c). A thread reads e and writes e_out
    only at its own elements, so e_out may be e."""
    t = cuda.threadIdx.x
    s, block, base, n = segment_block(g.shape[0], seg_len, seg_blocks)
    l1 = totals[3 * s + norms.ABS]
    if not abs(l1) < np.inf:
        if t == 0 and block == 0:
            scales[s] = np.float32(np.nan)
        return
    scale = _scale_of(scaling, n, l1, totals[3 * s + norms.SQUARE])
    if t == 0 and block == 0:
        scales[s] = scale
    stage = cuda.shared.array(STAGE, uint8)
    for k in range(8):
        local, i = element(k, 8, t, block)
        sign = 0
        if i < n:
            p = norms.load(g, e, lam, feedback, base + i)
            if p < 0:
                sign = 1
            if feedback:
                e_out[base + i] = p - (-scale if p < 0 else scale)
        stage[local] = sign
    cuda.syncthreads()
    start = s * ((seg_len + 7) // 8)
    pack_byte(stage, 1, bits[start:start + (n + 7) // 8], t, block)


def _run(g, e, lam: np.float64, feedback: bool, scaling: str, e_out, host_of, seg_len: int = 0) -> list:
    """Queue the two kernels over every segment of ``seg_len`` elements (0: g is one),
    copy the payload into ``host_of(layout)``, synchronise: [scales, bits]."""
    n = g.shape[0]
    seg_len = seg_len or max(n, 1)
    layout, whole, (scales, bits) = staged_segments(n, seg_len, 1, "onebit-payloads")
    totals = norms.launch_totals(g, e, lam, feedback, seg_len)
    grid, seg_blocks = segments_grid(n, seg_len, 1)
    _pack[grid, PACK_THREADS, device.stream()](
        g, e, lam, feedback, seg_len, seg_blocks, totals, SCALINGS.index(scaling), scales, bits, e_out)
    return scratch.copy_back(whole, layout, host_of(layout))


def encode(x, scaling: str) -> tuple[dict, list]:
    """Fields and [scale, sign bits] of ``x``; ValueError for a NaN or inf."""
    buffers = _run(x, x, np.float64(0), False, scaling, x, lambda layout: scratch.pooled_host(layout.nbytes))
    reject_non_finite(float(buffers[0][0]))
    return {}, buffers


def encode_feedback(g, e, lam: float, scaling: str, e_out, reuse=None) -> tuple[dict, list] | None:
    """Error feedback fused into onebit on the GPU: pass 1 the norms of p, pass 2 the signs
    and the residual. None (e_out untouched) for a non-finite p. The payload lands in
    ``reuse``'s host buffer where it is this layout's (see ``scratch.feedback_host``)."""
    buffers = _run(g, e, np.float64(lam), True, scaling, e_out,
                   lambda layout: scratch.feedback_host(layout, reuse))
    if not np.isfinite(buffers[0][0]):
        return None
    return {}, buffers


def encode_feedback_segments(g, e, lam: float, scaling: str, e_out, seg_len: int,
                             reuse: np.ndarray | None) -> tuple[list, np.ndarray]:
    """``encode_feedback`` of every segment of ``seg_len`` elements of g (a tensor's
    partitions) at once: the same two launches and one copy for all of them. Returns the
    (fields, buffers) of each segment, None for one whose p is not finite (its part of
    e_out untouched), and the pinned host array behind them: ``reuse`` where it fits,
    which the caller passes only once nobody reads the payloads it holds."""
    host = scratch.Reusing(reuse)
    scales, bits = _run(g, e, np.float64(lam), True, scaling, e_out, host, seg_len)
    return [({}, [scales[s:s + 1], segment_codes(bits, g.shape[0], seg_len, 1, s)]) if np.isfinite(scales[s])
            else None for s in range(scales.shape[0])], host.array


@cuda.jit(cache=True)
def _unpack_signs(bits, scale, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = -scale if (bits[i >> 3] >> (i & 7)) & 1 else scale


def decode(bits: np.ndarray, scale: np.float32, out) -> None:
    """``out[i] = -scale`` where sign bit i is set, else ``scale``, on the device: the
    payload goes over at its own size (n/8 bytes), never as n floats."""
    packed = uploads.upload(bits, "onebit-bits")
    _unpack_signs[blocks(out.shape[0]), THREADS, device.stream()](packed, np.float32(scale), out)
