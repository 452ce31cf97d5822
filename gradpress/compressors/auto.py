"""``{"compressor": "auto"}``: the planner picks each tensor's compression among options.

``allowed`` lists the options: codec names (with the defaults below) or full
compression_params dicts (their own parameters). Without it: onebit, topk 1%, randomk at
the user's ``k`` (default 1%), fp16 and none. Lossy codecs get vanilla error feedback
unless their dict says otherwise. Everything is checked here, before any training step.
"""
from __future__ import annotations

from typing import Any

from gradpress.compressors.registry import COMPRESSORS, build_compressor

AUTO = "auto"
AUTO_PARAMS = {"compressor", "allowed", "k", "seed"}


def defaults(k: float = 0.01, seed: int = 0) -> dict[str, dict[str, Any]]:
    return {
        "onebit": {"compressor": "onebit", "ef": "vanilla", "scaling": True},
        "topk": {"compressor": "topk", "k": 0.01, "ef": "vanilla"},
        "randomk": {"compressor": "randomk", "k": k, "ef": "vanilla", "seed": seed},
        "fp16": {"compressor": "fp16", "ef": "vanilla"},
        "none": {"compressor": "none"},
    }


def options(params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The options of an ``auto`` compression_params, by name. (Tensors below
    BYTEPS_MIN_COMPRESS_BYTES travel uncompressed whatever the options.)

    Raises:
        ValueError: an unknown key or codec, an empty or malformed ``allowed``.
    """
    unknown = sorted(set(params) - AUTO_PARAMS)
    if unknown:
        raise ValueError(f"unknown compression_params {unknown} for compressor 'auto'; "
                         f"accepted: {', '.join(sorted(AUTO_PARAMS))}")
    base = defaults(params.get("k", 0.01), params.get("seed", 0))
    allowed = params.get("allowed", list(base))
    if not isinstance(allowed, (list, tuple)) or not allowed:
        raise ValueError(f"compressor 'auto': 'allowed' must be a non-empty list of codec names or "
                         f"compression_params dicts, got {allowed!r}")
    out: dict[str, dict[str, Any]] = {}
    for i, entry in enumerate(allowed):
        if isinstance(entry, str):
            if entry not in base:
                raise ValueError(f"compressor 'auto': allowed[{i}] = {entry!r} is not a codec; accepted: "
                                 f"{', '.join(sorted(base))} (or a compression_params dict)")
            name, entry = entry, base[entry]
        elif isinstance(entry, dict):
            codec = entry.get("compressor", "none")
            if codec == AUTO or codec not in COMPRESSORS:
                raise ValueError(f"compressor 'auto': allowed[{i}] names compressor {codec!r}; accepted: "
                                 f"{', '.join(sorted(COMPRESSORS))}")
            name = codec if codec not in out else f"{codec}.{i}"
        else:
            raise ValueError(f"compressor 'auto': allowed[{i}] is a {type(entry).__name__}; expected a codec "
                             f"name or a compression_params dict")
        try:
            build_compressor(entry, "worker")
        except ValueError as e:
            raise ValueError(f"compressor 'auto': allowed[{i}]: {e}") from None
        if "momentum" in entry:
            raise ValueError(f"compressor 'auto': allowed[{i}] asks for worker momentum, which the planner "
                             f"cannot switch on and off between plans")
        out[name] = dict(entry)
    return out
