"""``{"compressor": "auto"}``: the planner picks each tensor's compression among options.

``allowed`` lists the options: codec names (with the defaults below) or full
compression_params dicts (their own parameters). Without it: onebit, topk 1%, randomk at
the user's ``k`` (default 1%), fp16 and none. Lossy codecs get vanilla error feedback
unless their dict says otherwise. Everything is checked here, before any training step.

The low-rank codecs (``powersgd``, ``acpsgd``: ``compressors/lowrank.py``) may be allowed
too, by name (their own defaults) or as a dict, at most one of them: the plan's matrices
that travel as factors are reduced together, with one set of parameters. They are not
among the defaults: they change what a step averages (factors carry the error of the
last steps), which a user should choose knowingly.
"""
from __future__ import annotations

from typing import Any

from gradpress.compressors.lowrank import CODECS as LOW_RANK
from gradpress.compressors.lowrank import LowRankParams
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
            if entry not in base and entry not in LOW_RANK:
                raise ValueError(f"compressor 'auto': allowed[{i}] = {entry!r} is not a codec; accepted: "
                                 f"{', '.join(sorted(base) + list(LOW_RANK))} (or a compression_params dict)")
            name, entry = entry, base.get(entry, {"compressor": entry})
        elif isinstance(entry, dict):
            codec = entry.get("compressor", "none")
            if codec == AUTO or (codec not in COMPRESSORS and codec not in LOW_RANK):
                raise ValueError(f"compressor 'auto': allowed[{i}] names compressor {codec!r}; accepted: "
                                 f"{', '.join(sorted(COMPRESSORS) + list(LOW_RANK))}")
            name = codec if codec not in out else f"{codec}.{i}"
        else:
            raise ValueError(f"compressor 'auto': allowed[{i}] is a {type(entry).__name__}; expected a codec "
                             f"name or a compression_params dict")
        if entry.get("compressor") in LOW_RANK:
            _check_low_rank(i, entry, out)
            out[name] = dict(entry)
            continue
        try:
            build_compressor(entry, "worker")
        except ValueError as e:
            raise ValueError(f"compressor 'auto': allowed[{i}]: {e}") from None
        if "momentum" in entry:
            raise ValueError(f"compressor 'auto': allowed[{i}] asks for worker momentum, which the planner "
                             f"cannot switch on and off between plans")
        out[name] = dict(entry)
    return out


def low_rank(options_: dict[str, dict[str, Any]]) -> tuple[str, LowRankParams] | None:
    """The low-rank option among checked ``options`` (its name and parameters), or None."""
    for name, params in options_.items():
        if params.get("compressor") in LOW_RANK:
            return name, LowRankParams.parse(params)
    return None


def _check_low_rank(i: int, entry: dict[str, Any], earlier: dict[str, dict[str, Any]]) -> None:
    try:
        params = LowRankParams.parse(entry)
    except ValueError as e:
        raise ValueError(f"compressor 'auto': allowed[{i}]: {e}") from None
    if low_rank(earlier) is not None:
        raise ValueError(f"compressor 'auto': allowed[{i}] is a second low-rank codec; the plan's matrices are "
                         f"reduced together, so allow at most one of {', '.join(LOW_RANK)}")
    if params.start_step:
        raise ValueError(f"compressor 'auto': allowed[{i}] has start_step {params.start_step}; under auto the "
                         f"first GRADPRESS_PLAN_STEPS steps already travel uncompressed (raise that instead)")
