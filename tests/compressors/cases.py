"""Codec configurations and inputs shared by the compressor tests."""
import numpy as np

from gradpress.compressors import build_compressor

# one entry per codec variant: (test id, compression_params)
CODEC_PARAMS = [
    ("none", {"compressor": "none"}),
    ("fp16", {"compressor": "fp16"}),
    ("onebit", {"compressor": "onebit"}),
    ("onebit-l1", {"compressor": "onebit", "scaling": True}),
    ("onebit-l2", {"compressor": "onebit", "scaling": "l2"}),
    ("topk-frac", {"compressor": "topk", "k": 0.2}),
    ("topk-count", {"compressor": "topk", "k": 3}),
    ("randomk", {"compressor": "randomk", "k": 0.25, "seed": 7}),
    ("randomk-scaled", {"compressor": "randomk", "k": 0.25, "seed": 7, "scaling": True}),
    ("dither-linear-max", {"compressor": "dithering", "s": 7, "seed": 3}),
    ("dither-linear-l2", {"compressor": "dithering", "s": 1, "normalize": "l2"}),
    ("dither-natural-max", {"compressor": "dithering", "s": 3, "partition": "natural"}),
    ("dither-natural-l2", {"compressor": "dithering", "s": 100, "partition": "natural",
                           "normalize": "l2"}),
]
CODEC_IDS = [name for name, _ in CODEC_PARAMS]
UNBIASED = ["randomk-scaled", "dither-linear-max", "dither-linear-l2", "dither-natural-max",
            "dither-natural-l2"]
EDGE_LENGTHS = [0, 1, 2, 7, 8, 9, 15, 17, 4095, 4097]


def codec(name: str, role: str = "server"):
    return build_compressor(dict(CODEC_PARAMS)[name], role)


def decompressed(c, header: dict, buffers: list, n: int, key: int = 0, round: int = 0,
                 dtype=np.float32) -> np.ndarray:
    out = np.full(n, np.nan, dtype)  # NaN shows any entry decompress forgot to write
    c.decompress(header, buffers, out, key=key, round=round)
    return out


def gaussian(n: int, seed: int = 0, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


def same_payload(a, b) -> str:
    """Empty when both payloads are byte-identical, else what differs."""
    (ha, ba), (hb, bb) = a, b
    if ha != hb:
        return f"headers differ: {ha} vs {hb}"
    if len(ba) != len(bb):
        return f"{len(ba)} vs {len(bb)} buffers"
    for position, (x, y) in enumerate(zip(ba, bb)):
        if bytes(memoryview(x).cast("B")) != bytes(memoryview(y).cast("B")):
            return f"buffer {position} differs"
    return ""
