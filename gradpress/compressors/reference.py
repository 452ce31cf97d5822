"""Plain numpy reference of every codec (slow, obviously right): the same payloads as the
kernels, built from float32 input with whole-array numpy operations. Tests compare the
kernels with it; ``benchmarks/kernels.py`` uses it as the baseline.
"""
import math

import numpy as np

from gradpress.kernels.reduction import CHUNK, LANES
from gradpress.kernels.rng import below_py, draw_bits_py, stream_id


def ordered_sum(values: np.ndarray) -> float:
    """Sum in the order of ``kernels.reduction`` (lanes sequential, then pairwise trees)."""
    chunks = -(-values.shape[0] // CHUNK)
    padded = np.zeros(chunks * CHUNK)
    padded[:values.shape[0]] = values
    lanes = np.zeros((chunks, LANES))
    for step in padded.reshape(chunks, CHUNK // LANES, LANES).transpose(1, 0, 2):
        lanes += step  # one row at a time: lane j adds its elements in increasing order
    while lanes.shape[1] > 1:
        lanes = lanes[:, 0::2] + lanes[:, 1::2]
    total = lanes[:, 0]
    while total.shape[0] > 1:
        paired = total[0:total.shape[0] // 2 * 2:2] + total[1::2]
        total = np.concatenate([paired, total[-1:]]) if total.shape[0] % 2 else paired
    return float(total[0]) if total.shape[0] else 0.0


def pack_codes(codes: np.ndarray, width: int) -> np.ndarray:
    """Codes (< 2**width) packed least significant first, ``8 // width`` per byte."""
    per_byte = 8 // width
    padded = np.zeros(-(-codes.shape[0] // per_byte) * per_byte, np.uint32)
    padded[:codes.shape[0]] = codes
    shifts = np.arange(per_byte, dtype=np.uint32) * width
    return (padded.reshape(-1, per_byte) << shifts).sum(axis=1).astype(np.uint8)


def unpack_codes(packed: np.ndarray, width: int, n: int) -> np.ndarray:
    shifts = np.arange(8 // width, dtype=np.uint32) * width
    codes = (packed.astype(np.uint32)[:, None] >> shifts) & ((1 << width) - 1)
    return codes.reshape(-1)[:n]


def onebit(x: np.ndarray, scaling: str) -> list:
    n = x.shape[0]
    magnitude = np.abs(x.astype(np.float64))
    scale = {"l1": lambda: ordered_sum(magnitude) / n,
             "l2": lambda: math.sqrt(ordered_sum(magnitude * magnitude) / n),
             "none": lambda: 1.0}[scaling]()
    return [np.array([scale], np.float32), np.packbits(x < 0, bitorder="little")]


def onebit_decode(buffers: list, n: int) -> np.ndarray:
    scale, bits = buffers
    signs = np.unpackbits(bits, count=n, bitorder="little")
    return np.where(signs == 1, -scale[0], scale[0]).astype(np.float32)


def topk(x: np.ndarray, k: int) -> list:
    order = np.lexsort((np.arange(x.shape[0]), -np.abs(x)))  # by magnitude, then index
    indices = np.sort(order[:k]).astype(np.uint32)
    return [indices, x[indices]]


def random_indices(n: int, k: int, seed: int, key: int, round: int) -> np.ndarray:
    """Floyd's algorithm with a Python set; the draws are computed as one array."""
    steps = np.arange(k, dtype=np.uint64)
    bounds = np.arange(n - k, n, dtype=np.uint64) + np.uint64(1)
    picks = below_py(draw_bits_py(stream_id(seed, key, round), steps), bounds)
    chosen: set = set()
    for pick, j in zip(picks.tolist(), range(n - k, n)):
        chosen.add(j if pick in chosen else pick)
    return np.array(sorted(chosen), np.uint32)


def randomk(x: np.ndarray, k: int, seed: int, key: int, round: int, scaling: bool) -> list:
    indices = random_indices(x.shape[0], k, seed, key, round)
    scale = x.shape[0] / k if scaling else 1.0
    return [(x[indices].astype(np.float64) * scale).astype(np.float32)]


def pairs_decode(indices: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, np.float32)
    out[indices] = values
    return out


def dithering(x: np.ndarray, s: int, natural: bool, normalize: str, width: int, seed: int,
              key: int, round: int) -> list:
    magnitude = np.abs(x.astype(np.float64))
    norm = np.float32(math.sqrt(ordered_sum(magnitude * magnitude))) if normalize == "l2" \
        else np.float32(magnitude.max())
    draws = draw_bits_py(stream_id(seed, key, round), np.arange(x.shape[0], dtype=np.uint64))
    u = (draws >> np.uint64(40)).astype(np.float64) / (1 << 24)
    levels = np.zeros(x.shape[0], np.int64)
    if norm > 0:
        if natural:
            t = magnitude / np.float64(norm)
            mantissa, exponent = np.frexp(t)
            high = exponent >= 2 - s
            low = np.where(high, s - 1 + exponent, 0)
            up = np.where(high, 2 * mantissa - 1, np.ldexp(t, s - 1))
            low[t == 0] = 0
            up[t == 0] = 0.0
        else:
            y = magnitude * s / np.float64(norm)
            low = np.floor(y).astype(np.int64)
            up = y - low
        levels = low + (u < up)
    sign = ((x < 0) & (levels > 0)).astype(np.int64) << (width - 1)
    return [np.array([norm], np.float32), pack_codes(levels | sign, width)]


def dithering_decode(buffers: list, s: int, natural: bool, width: int, n: int) -> np.ndarray:
    norm = np.float64(buffers[0][0])
    codes = unpack_codes(buffers[1], width, n).astype(np.int64)
    levels = codes & ((1 << (width - 1)) - 1)
    values = np.ldexp(norm, levels - s) if natural else norm * levels / s
    values = np.where(levels == 0, 0.0, values)
    return np.where(codes >> (width - 1), -values, values).astype(np.float32)


def fp16(x: np.ndarray) -> list:
    return [x.astype(np.float16).view(np.uint16)]


def fp16_decode(buffers: list) -> np.ndarray:
    return buffers[0].view(np.float16).astype(np.float32)
