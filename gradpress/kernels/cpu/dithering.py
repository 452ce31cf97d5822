"""CPU kernels of dithering: quantise with stochastic rounding and pack codes, decode by
table. A code is the level with the sign in its top bit (set only for a negative input
with a non-zero level)."""
import numpy as np
from numba import njit

from gradpress.kernels.quantize import level
from gradpress.kernels.rng import draw_bits, uniform24


@njit(nogil=True, cache=True)
def encode(x: np.ndarray, norm: np.float32, s: int, natural: bool, width: int,
           stream: np.uint64, codes: np.ndarray) -> None:
    """Pack the code of every ``x[i]`` (random draw ``i`` of ``stream``) into ``codes``."""
    n = x.shape[0]
    per_byte = 8 // width
    sign_bit = 1 << (width - 1)
    norm64 = np.float64(norm)
    for b in range(codes.shape[0]):
        byte = 0
        for j in range(per_byte):
            i = b * per_byte + j
            if i < n and norm64 > 0.0:
                u = uniform24(draw_bits(stream, np.uint64(i)))
                lv = level(abs(np.float64(x[i])), norm64, s, natural, u)
                code = lv | sign_bit if (x[i] < 0 and lv > 0) else lv
                byte |= code << (j * width)
        codes[b] = byte


@njit(nogil=True, cache=True)
def decode(codes: np.ndarray, table: np.ndarray, width: int, out: np.ndarray,
           accumulate: bool) -> None:
    """``out[i] (+)= table[code i]``."""
    per_byte = 8 // width
    mask = (1 << width) - 1
    for i in range(out.shape[0]):
        code = (codes[i // per_byte] >> ((i % per_byte) * width)) & mask
        if accumulate:
            out[i] += table[code]
        else:
            out[i] = table[code]


@njit(nogil=True, cache=True)
def codes_within(codes: np.ndarray, s: int, width: int, n: int) -> bool:
    """Payload check: every level <= s and the padding bits of the last byte are zero."""
    per_byte = 8 // width
    level_mask = (1 << (width - 1)) - 1
    for b in range(codes.shape[0]):
        byte = codes[b]
        for j in range(per_byte):
            code = (byte >> (j * width)) & ((1 << width) - 1)
            if b * per_byte + j >= n:
                if code:
                    return False
            elif code & level_mask > s:
                return False
    return True
