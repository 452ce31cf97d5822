"""dithering encoder on the GPU, bare and with error feedback fused in: the same
per-element quantisation (``kernels.quantize``) and random draws as the CPU kernel.
Two launches and one copy, as onebit's: the norms of p on the device, then the norm
(NaN marks a NaN/inf in p), the packed codes and the residual in one kernel; norm and
codes, in one allocation, come back in one copy. A tensor's partitions go through the
same two launches and copy together, each with its own norm and random stream."""
import numpy as np
from numba import cuda, float32, uint8

from gradpress.kernels.cuda import device, norms, scratch, uploads
from gradpress.kernels.cuda.packing import (
    PACK_THREADS, STAGE, element, pack_byte, segment_block, segment_codes, segments_grid, staged_segments)
from gradpress.kernels.quantize import level_py, level_value_py
from gradpress.kernels.rng import draw_bits_py, uniform24_py
from gradpress.kernels.scaling import l2_norm_py
from gradpress.errors import NonFiniteInput

_level = cuda.jit(device=True)(level_py)
_level_value = cuda.jit(device=True)(level_value_py)
_draw_bits = cuda.jit(device=True)(draw_bits_py)
_uniform24 = cuda.jit(device=True)(uniform24_py)
_l2_norm = cuda.jit(device=True)(l2_norm_py)


@cuda.jit(cache=True)
def _encode(g, e, lam, feedback, seg_len, seg_blocks, totals, l2, s, natural, width, draw, draws, norms_out,
            codes, e_out):
    """Per segment q of ``seg_len`` elements (the last one shorter), coded by the
    ``seg_blocks`` blocks from q * seg_blocks with the random stream ``draws[q]`` (``draw``
    where ``draws`` is empty: one segment): its norm from its totals
    (``norms.launch_totals``, as ``scaling.norm_from``) into norms_out[q], NaN where its
    largest |p| or its norm (an l2 norm of finite values may overflow float32) is not
    finite, and then nothing else; else the codes of p from byte
    q * ceil(seg_len * width / 8) of ``codes`` and, with ``feedback``, e_out = p - D(code)
    at the thread's own elements (so e_out may be e), D from a block's copy of
    ``quantize.code_table`` in shared memory."""
    t = cuda.threadIdx.x
    q, block, base, n = segment_block(g.shape[0], seg_len, seg_blocks)
    largest = totals[3 * q + norms.LARGEST]
    norm32 = _l2_norm(totals[3 * q + norms.SQUARE]) if l2 else np.float32(largest)
    if not (largest < np.inf and norm32 < np.inf):
        if t == 0 and block == 0:
            norms_out[q] = np.float32(np.nan)
        return
    if t == 0 and block == 0:
        norms_out[q] = norm32
    norm = np.float64(norm32)
    stream = draws[q] if draws.shape[0] > 0 else draw
    sign_bit = 1 << (width - 1)
    table = cuda.shared.array(256, float32)
    for code in range(t, (1 << width) if feedback else 0, PACK_THREADS):
        lv = code & (sign_bit - 1)
        value = np.float32(0.0)
        if lv <= s:
            value = np.float32(_level_value(lv, norm, s, natural))
            if code & sign_bit:
                value = -value
        table[code] = value
    cuda.syncthreads()
    per_byte = 8 // width
    stage = cuda.shared.array(STAGE, uint8)
    for k in range(per_byte):
        local, i = element(k, per_byte, t, block)
        code = 0
        if i < n:
            p = norms.load(g, e, lam, feedback, base + i)
            if norm > 0.0:
                u = _uniform24(_draw_bits(stream, np.uint64(i)))
                lv = _level(abs(np.float64(p)), norm, s, natural, u)
                code = lv | sign_bit if (p < 0 and lv > 0) else lv
            if feedback:
                e_out[base + i] = p - table[code]
        stage[local] = code
    cuda.syncthreads()
    start = q * ((seg_len + per_byte - 1) // per_byte)
    pack_byte(stage, width, codes[start:start + (n + per_byte - 1) // per_byte], t, block)


def _run(g, e, lam: np.float64, feedback: bool, config, draws: list, e_out, host_of, seg_len: int = 0) -> list:
    """Queue the two kernels over every segment of ``seg_len`` elements (0: g is one),
    segment q drawing from stream ``draws[q]``, copy [norms, codes] into
    ``host_of(layout)``, synchronise."""
    n, width = g.shape[0], config.width
    seg_len = seg_len or max(n, 1)
    layout, whole, (norms_out, codes) = staged_segments(n, seg_len, width, "dithering-payloads")
    streams = scratch.device_array((0,), np.uint64, "dithering-draws") if n <= seg_len else \
        uploads.upload(np.array(draws, np.uint64), "dithering-draws")  # (one segment: ``draws[0]`` alone)
    totals = norms.launch_totals(g, e, lam, feedback, seg_len)
    grid, seg_blocks = segments_grid(n, seg_len, width)
    _encode[grid, PACK_THREADS, device.stream()](
        g, e, lam, feedback, seg_len, seg_blocks, totals, config.normalize == "l2", config.s,
        config.partition == "natural", width, np.uint64(draws[0]), streams, norms_out, codes, e_out)
    return scratch.copy_back(whole, layout, host_of(layout))


def encode(x, config, draws: np.uint64) -> list:
    """[norm, packed codes] for a ``Dithering`` configuration; ValueError for a NaN or inf."""
    buffers = _run(x, x, np.float64(0), False, config, [draws], x,
                   lambda layout: scratch.pooled_host(layout.nbytes))
    if np.isnan(buffers[0][0]):
        raise NonFiniteInput("dithering input contains NaN or inf, or its l2 norm overflows float32")
    return buffers


def encode_feedback(g, e, lam: float, config, draws: np.uint64, e_out, reuse=None) -> list | None:
    """Error feedback fused into dithering: pass 1 the norms of p, pass 2 codes and
    residual. [norm, codes], or None (e_out untouched) for a NaN/inf in p; the payload
    lands in ``reuse``'s host buffer where it is this layout's."""
    buffers = _run(g, e, np.float64(lam), True, config, [draws], e_out,
                   lambda layout: scratch.feedback_host(layout, reuse))
    return None if np.isnan(buffers[0][0]) else buffers


def encode_feedback_segments(g, e, lam: float, config, draws: list, e_out, seg_len: int,
                             reuse: np.ndarray | None) -> tuple[list, np.ndarray]:
    """``encode_feedback`` of every segment of ``seg_len`` elements of g (a tensor's
    partitions; segment q draws from stream ``draws[q]``) at once: the same two launches
    and one copy for all of them, after one upload of the streams. Returns per segment
    [norm, codes], None where its p is not finite (its part of e_out untouched), and the
    pinned host array behind them: ``reuse`` where it fits, which the caller passes only
    once nobody reads the payloads it holds."""
    host = scratch.Reusing(reuse)
    norms_host, codes = _run(g, e, np.float64(lam), True, config, draws, e_out, host, seg_len)
    return [None if np.isnan(norms_host[q]) else
            [norms_host[q:q + 1], segment_codes(codes, g.shape[0], seg_len, config.width, q)]
            for q in range(norms_host.shape[0])], host.array
