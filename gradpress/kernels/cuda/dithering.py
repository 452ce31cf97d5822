"""dithering encoder on the GPU, bare and with error feedback fused in: one thread per
output byte, the same per-element quantisation (``kernels.quantize``) and random draws as
the CPU kernel."""
import numpy as np
from numba import cuda

from gradpress.kernels.bitlayout import packed_nbytes
from gradpress.kernels.cpu.norms import INF_BITS
from gradpress.kernels.cuda import norms
from gradpress.kernels.cuda.device import THREADS, blocks
from gradpress.kernels.quantize import code_table, level_py
from gradpress.kernels.rng import draw_bits_py, uniform24_py
from gradpress.kernels.scaling import norm_from

_level = cuda.jit(device=True)(level_py)
_draw_bits = cuda.jit(device=True)(draw_bits_py)
_uniform24 = cuda.jit(device=True)(uniform24_py)


@cuda.jit
def _encode(x, norm, s, natural, width, stream, codes):
    b = cuda.grid(1)
    if b >= codes.shape[0]:
        return
    per_byte = 8 // width
    sign_bit = 1 << (width - 1)
    byte = 0
    for j in range(per_byte):
        i = b * per_byte + j
        if i < x.shape[0] and norm > 0.0:
            u = _uniform24(_draw_bits(stream, np.uint64(i)))
            lv = _level(abs(np.float64(x[i])), norm, s, natural, u)
            code = lv | sign_bit if (x[i] < 0 and lv > 0) else lv
            byte |= code << (j * width)
    codes[b] = byte


def encode(x, config, stream: np.uint64) -> tuple:
    """Norm and packed codes for a ``Dithering`` configuration."""
    max_bits = norms.max_abs_bits(x)
    if max_bits >= INF_BITS:
        raise ValueError("dithering input contains NaN or inf")
    square_sum = norms.square_sum(x) if config.normalize == "l2" else 0.0
    norm = norm_from(config.normalize, square_sum, max_bits)
    codes = cuda.device_array(packed_nbytes(x.shape[0], config.width), np.uint8)
    _encode[blocks(codes.shape[0]), THREADS](
        x, np.float64(norm), config.s, config.partition == "natural", config.width, stream,
        codes)
    return norm, codes.copy_to_host()


@cuda.jit
def _encode_feedback(g, e, lam, norm, s, natural, width, stream, table, codes, e_out):
    """Pass 2: ``_encode`` of p = g + lam * e, and e_out = p - table[code] at the
    thread's own elements (so e_out may be e)."""
    b = cuda.grid(1)
    if b >= codes.shape[0]:
        return
    per_byte = 8 // width
    sign_bit = 1 << (width - 1)
    byte = 0
    for j in range(per_byte):
        i = b * per_byte + j
        if i < g.shape[0]:
            p = g[i] + lam * e[i]
            code = 0
            if norm > 0.0:
                u = _uniform24(_draw_bits(stream, np.uint64(i)))
                lv = _level(abs(np.float64(p)), norm, s, natural, u)
                code = lv | sign_bit if (p < 0 and lv > 0) else lv
            byte |= code << (j * width)
            e_out[i] = p - table[code]
    codes[b] = byte


def encode_feedback(g, e, lam: float, config, stream: np.uint64, e_out) -> tuple | None:
    """Error feedback fused into dithering: pass 1 the norm of p (the NaN/inf check),
    pass 2 codes and residual. (norm, host codes), or None (nothing written)."""
    lam = np.float32(lam)
    max_bits = norms.feedback_max_abs_bits(g, e, lam)
    if max_bits >= INF_BITS:
        return None
    square_sum = norms.feedback_sum(g, e, lam, True) if config.normalize == "l2" else 0.0
    norm = norm_from(config.normalize, square_sum, max_bits)
    natural = config.partition == "natural"
    table = cuda.to_device(code_table(norm, config.s, natural, config.width))
    codes = cuda.device_array(packed_nbytes(g.shape[0], config.width), np.uint8)
    _encode_feedback[blocks(codes.shape[0]), THREADS](
        g, e, lam, np.float64(norm), config.s, natural, config.width, stream, table, codes,
        e_out)
    return norm, codes.copy_to_host()
