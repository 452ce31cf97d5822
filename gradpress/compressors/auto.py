"""``{"compressor": "auto"}``: the planner picks each tensor's compression among options.

``allowed`` lists the options: codec names (with the defaults below) or full
compression_params dicts (their own parameters). Without it: onebit, topk 1%, randomk at
the user's ``k`` (default 1%), fp16, fp16_raw and none. A codec given by name gets the
defaults below (vanilla error feedback for the lossy ones); a dict is taken as it is
(error feedback only where it says ``ef``). A codec given twice with different parameters
keeps both, the later as ``<codec>.<index>``. Everything is checked here, before any training step.

``fp16_raw`` is no codec: it is ``Compression.fp16``'s way, the group cast to float16
(on its device) and pushed uncompressed, the servers summing the halves (in float32,
rounded once), no error feedback and no recompression. On a GPU worker it costs a cast on
the card and half the raw path's copies, where the fp16 codec's error feedback and
encode cost the communication thread a kernel per partition (in an H200 run of the
transformer's job, ``Compression.fp16`` was the fastest setting and ``auto``, without this
option, took 1.12x its step: docs/performance.md). As with
``Compression.fp16`` (and torch's ``fp16_compress_hook``), a value beyond float16's range
(65504), in a gradient or in the sum, arrives as inf: what AMP's GradScaler reads as an
overflowed step. The fp16 codec refuses such a step with an error instead.

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
HALVES = "fp16_raw"
AUTO_PARAMS = {"compressor", "allowed", "k", "seed"}


def defaults(k: float = 0.01, seed: int = 0) -> dict[str, dict[str, Any]]:
    return {
        "onebit": {"compressor": "onebit", "ef": "vanilla", "scaling": True},
        "topk": {"compressor": "topk", "k": 0.01, "ef": "vanilla"},
        "randomk": {"compressor": "randomk", "k": k, "ef": "vanilla", "seed": seed},
        "fp16": {"compressor": "fp16", "ef": "vanilla"},
        HALVES: {"compressor": HALVES},
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
            if entry in out.values():
                continue  # (named twice)
            name = name if name not in out else f"{name}.{i}"  # (a dict of this codec came first)
        elif isinstance(entry, dict):
            codec = entry.get("compressor", "none")
            if codec == HALVES and len(entry) > 1:
                raise ValueError(f"compressor 'auto': allowed[{i}] = {entry!r}: {HALVES!r} takes no "
                                 f"parameters (float16 on the wire, no error feedback)")
            if codec == AUTO or (codec not in COMPRESSORS and codec not in LOW_RANK and codec != HALVES):
                raise ValueError(f"compressor 'auto': allowed[{i}] names compressor {codec!r}; accepted: "
                                 f"{', '.join(sorted(COMPRESSORS) + list(LOW_RANK) + [HALVES])}")
            name = codec if codec not in out else f"{codec}.{i}"
        else:
            raise ValueError(f"compressor 'auto': allowed[{i}] is a {type(entry).__name__}; expected a codec "
                             f"name or a compression_params dict")
        if entry.get("compressor") in LOW_RANK:
            _check_low_rank(i, entry, out)
            out[name] = dict(entry)
            continue
        if raw_halves(entry):
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


def for_dtypes(options_: dict[str, dict[str, Any]], dtypes: set[str]) -> dict[str, dict[str, Any]]:
    """``options_`` for tensors of ``dtypes`` (``str`` of torch's): ``fp16_raw`` left out where any of
    them is bfloat16 (``none`` stands in where it was the only option).

    ``Compression.fp16`` keeps bfloat16 (float16 would overflow it), which travels widened to
    float32 as it does raw, while the planner's model counts the option at two bytes an
    element; and a planned group of bfloat16 and float32 members fills one float32 buffer,
    which the option would narrow to float16 as a whole, bfloat16's values with it."""
    if "bfloat16" not in {d.removeprefix("torch.") for d in dtypes} or not any(map(raw_halves, options_.values())):
        return options_
    kept = {name: o for name, o in options_.items() if not raw_halves(o)}
    return kept or {"none": {"compressor": "none"}}


def raw_halves(params: dict[str, Any]) -> bool:
    """Whether an option is ``fp16_raw``: float16 on the wire, uncompressed (``Compression.fp16``)."""
    return params.get("compressor") == HALVES


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
