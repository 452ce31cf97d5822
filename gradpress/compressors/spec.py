"""``CodecSpec``: one tensor's compression, checked once, carried unchanged to the servers.

Vocabulary, everywhere in gradpress: ``compression_params`` is the user's dict (BytePS's
keys: compressor, ef, momentum, k, ...), ``codec`` the codec's name, ``compressor`` the
object that compresses (``build_compressor``), and ``CodecSpec`` the checked, frozen
form of the dict that travels from the policy to the worker's keys and, as
``compression_params`` in DECLARE and INIT_KEY, to the scheduler and the servers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gradpress.compressors import auto, lowrank
from gradpress.compressors.registry import COMPRESSORS, build_compressor

# Codecs work on float32 partitions (the one home of this rule). Half-precision gradients are
# compressed too: the gradient pipeline widens them to float32 on their own device first and
# narrows the average back; other dtypes travel uncompressed.
COMPRESSIBLE_DTYPES = ("float32",)
WIDENED_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class CodecSpec:
    codec: str
    params: tuple[tuple[str, Any], ...]  # the compression_params' items, sorted: immutable and comparable

    @classmethod
    def from_params(cls, compression_params: Any, where: str = "compression_params") -> "CodecSpec | None":
        """The checked spec of ``compression_params``; None when it asks for no compression.

        Raises:
            ValueError: ``where`` and what is wrong (unknown codec, key or value).
        """
        if isinstance(compression_params, CodecSpec):
            return compression_params
        if not isinstance(compression_params, dict):
            raise ValueError(f"{where}: expected a dict of compression_params, got "
                             f"{type(compression_params).__name__}")
        codec = compression_params.get("compressor", "none")
        names = sorted({*COMPRESSORS, auto.AUTO, *lowrank.CODECS})
        if not isinstance(codec, str) or codec.lower() not in names + [auto.HALVES]:
            raise ValueError(f"{where}: compression_params['compressor'] = {codec!r}; accepted: {', '.join(names)}")
        if codec != codec.lower():  # names are case-insensitive; the spec (and the wire) carries them lower case
            codec = codec.lower()
            compression_params = {**compression_params, "compressor": codec}
        if codec == auto.HALVES:
            raise ValueError(f"{where}: {auto.HALVES!r} is an option of compressor 'auto' only; to send "
                             f"float16 on the wire yourself, pass compression=Compression.fp16")
        try:
            if codec == auto.AUTO:  # the planner picks per tensor among these options
                auto.options(compression_params)
            elif codec in lowrank.CODECS:  # whole matrices, factored on the workers (pipeline/lowrank.py)
                lowrank.LowRankParams.parse(compression_params)
            else:  # the worker's chain (Momentum(ErrorFeedback(codec))) reads every key a server reads
                build_compressor(compression_params, "worker")
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if codec == "none":
            # ef and momentum act on a codec's output: with none the gradient travels raw, and
            # dropping them silently would train without the momentum the user asked for
            asked = [key for key in ("ef", "momentum") if compression_params.get(key) is not None]
            if asked:
                raise ValueError(f"{where}: {' and '.join(asked)} need a codec, but compressor is 'none' (the "
                                 f"gradient travels raw): pick a codec, or leave the momentum to the optimizer")
            return None
        return cls(codec, tuple(sorted(compression_params.items())))

    @property
    def compression_params(self) -> dict[str, Any]:
        """The user's dict, as it travels on the wire."""
        return dict(self.params)

    @property
    def is_auto(self) -> bool:
        return self.codec == auto.AUTO

    @property
    def is_lowrank(self) -> bool:
        """powersgd / acpsgd: the factors travel uncompressed; no per-partition compressor."""
        return self.codec in lowrank.CODECS

    def build(self, role: str):
        """A new compressor for ``role`` (its state, residuals and momentum, starts empty)."""
        if self.is_auto:
            raise ValueError("compressor 'auto' is resolved by the planner per tensor, not built")
        if self.is_lowrank:
            raise ValueError(f"compressor {self.codec!r} factors whole gradient matrices on the workers "
                             f"(DistributedOptimizer, OneBitAdam, ZeroOneAdam); a single push_pull cannot carry it")
        return build_compressor(self.compression_params, role)

    @staticmethod
    def accepts(dtype: str) -> bool:
        return dtype in COMPRESSIBLE_DTYPES

    def check_dtype(self, dtype: str, what: str) -> None:
        if not self.accepts(dtype):
            raise ValueError(f"{what}: compression_params ({self.codec}) apply to "
                             f"{'/'.join(COMPRESSIBLE_DTYPES)} tensors, not {dtype}")

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params)
