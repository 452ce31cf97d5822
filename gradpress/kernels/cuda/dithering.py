"""dithering encoder on the GPU, bare and with error feedback fused in: the same
per-element quantisation (``kernels.quantize``) and random draws as the CPU kernel.
Two launches and one copy, as onebit's: the norms of p on the device, then the norm
(NaN marks a NaN/inf in p), the packed codes and the residual in one kernel; norm and
codes, in one allocation, come back in one copy."""
import numpy as np
from numba import cuda, float32, uint8

from gradpress.kernels.bitlayout import packed_nbytes
from gradpress.kernels.cuda import device, norms, scratch
from gradpress.kernels.cuda.packing import PACK_THREADS, STAGE, element, pack_blocks, pack_byte
from gradpress.kernels.quantize import level_py, level_value_py
from gradpress.kernels.rng import draw_bits_py, uniform24_py
from gradpress.kernels.scaling import l2_norm_py

_level = cuda.jit(device=True)(level_py)
_level_value = cuda.jit(device=True)(level_value_py)
_draw_bits = cuda.jit(device=True)(draw_bits_py)
_uniform24 = cuda.jit(device=True)(uniform24_py)
_l2_norm = cuda.jit(device=True)(l2_norm_py)


@cuda.jit
def _encode(g, e, lam, feedback, totals, l2, s, natural, width, draws, norm_out, codes, e_out):
    """The norm from the totals (``norms.launch_totals``, as ``scaling.norm_from``) into
    norm_out[0], NaN where the largest |p| is not finite, and then nothing else; else the
    codes of p and, with ``feedback``, e_out = p - D(code) at the thread's own elements (so
    e_out may be e), D from a block's copy of ``quantize.code_table`` in shared memory."""
    t = cuda.threadIdx.x
    block = cuda.blockIdx.x
    largest = totals[norms.LARGEST]
    if not largest < np.inf:
        if t == 0 and block == 0:
            norm_out[0] = np.float32(np.nan)
        return
    norm32 = _l2_norm(totals[norms.SQUARE]) if l2 else np.float32(largest)
    if t == 0 and block == 0:
        norm_out[0] = norm32
    norm = np.float64(norm32)
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
        if i < g.shape[0]:
            p = norms.load(g, e, lam, feedback, i)
            if norm > 0.0:
                u = _uniform24(_draw_bits(draws, np.uint64(i)))
                lv = _level(abs(np.float64(p)), norm, s, natural, u)
                code = lv | sign_bit if (p < 0 and lv > 0) else lv
            if feedback:
                e_out[i] = p - table[code]
        stage[local] = code
    cuda.syncthreads()
    pack_byte(stage, width, codes, t, block)


def _run(g, e, lam: np.float32, feedback: bool, config, draws: np.uint64, e_out, host_of) -> list:
    """Queue the two kernels, copy [norm, codes] into ``host_of(layout)``, synchronise."""
    width = config.width
    natural = config.partition == "natural"
    layout = scratch.Layout(((np.float32, 1), (np.uint8, packed_nbytes(g.shape[0], width))), 2)
    whole, (norm, codes) = scratch.staged(layout)
    totals = norms.launch_totals(g, e, lam, feedback)
    _encode[pack_blocks(codes.shape[0]), PACK_THREADS, device.stream()](
        g, e, lam, feedback, totals, config.normalize == "l2", config.s, natural, width, draws,
        norm, codes, e_out)
    return scratch.copy_back(whole, layout, host_of(layout))


def encode(x, config, draws: np.uint64) -> list:
    """[norm, packed codes] for a ``Dithering`` configuration; ValueError for a NaN or inf."""
    buffers = _run(x, x, np.float32(0), False, config, draws, x,
                   lambda layout: scratch.pooled_host(layout.nbytes))
    if np.isnan(buffers[0][0]):
        raise ValueError("dithering input contains NaN or inf")
    return buffers


def encode_feedback(g, e, lam: float, config, draws: np.uint64, e_out, reuse=None) -> list | None:
    """Error feedback fused into dithering: pass 1 the norms of p, pass 2 codes and
    residual. [norm, codes], or None (e_out untouched) for a NaN/inf in p; the payload
    lands in ``reuse``'s host buffer where it is this layout's."""
    buffers = _run(g, e, np.float32(lam), True, config, draws, e_out,
                   lambda layout: scratch.feedback_host(layout, reuse))
    return None if np.isnan(buffers[0][0]) else buffers
