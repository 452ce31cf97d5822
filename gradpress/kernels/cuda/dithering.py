"""dithering encoder on the GPU: one thread per output byte, the same per-element
quantisation (``kernels.quantize``) and random draws as the CPU kernel."""
import numpy as np
from numba import cuda

from gradpress.kernels.bitlayout import packed_nbytes
from gradpress.kernels.cpu.norms import INF_BITS
from gradpress.kernels.cuda import norms
from gradpress.kernels.cuda.device import THREADS, blocks
from gradpress.kernels.quantize import level_py
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
