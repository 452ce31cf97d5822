"""``powersgd`` and ``acpsgd``: low-rank compression of whole gradient matrices.

Unlike the registry's codecs these do not compress a flat partition: a gradient of 2 or
more dimensions is viewed as an n x m matrix (first dimension by the rest) and replaced by
factors P (n x r) and Q (m x r) that travel as ordinary float32 tensors. The servers' sum
of the workers' factors is exact, so servers neither decompress nor keep error feedback:
everything else (error buffers, orthonormalisation, warm start) happens on the workers, in
``gradpress.pipeline.lowrank``. This module checks the ``compression_params`` once.

- ``powersgd`` (Vogels et al., PyTorch's hook): two rounds per step, P then Q.
- ``acpsgd`` (arXiv 2306.08881): one round per step, P and Q alternately.

Parameters: ``rank`` (default 4, at least 1), ``start_step`` (steps of plain uncompressed
averaging first, default 0), ``min_compression_rate`` (a matrix is compressed only when
n * m >= rate * r * (n + m), default 2, as PyTorch's hook decides), ``seed`` (of the
initial factors, identical on every worker; default 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gradpress.compressors.params import number

CODECS = ("powersgd", "acpsgd")
ACCEPTED_PARAMS = {
    "compressor": "powersgd | acpsgd",
    "rank": "factor rank r >= 1 (default 4)",
    "start_step": "steps averaged uncompressed before compression starts (default 0)",
    "min_compression_rate": "compress a matrix only when its factors are this many times smaller (default 2)",
    "seed": "seed of the initial factors, the same on every worker (default 0)",
}


@dataclass(frozen=True)
class LowRankParams:
    method: str
    rank: int
    start_step: int
    min_compression_rate: float
    seed: int

    @classmethod
    def parse(cls, params: dict[str, Any]) -> "LowRankParams":
        """Raises ValueError naming the key and what is accepted."""
        method = params.get("compressor")
        if method not in CODECS:
            raise ValueError(f"compressor {method!r} is not a low-rank codec; accepted: {', '.join(CODECS)}")
        unknown = sorted(set(params) - set(ACCEPTED_PARAMS))
        if unknown:
            raise ValueError(f"unknown compression_params {unknown} for compressor {method!r}; accepted: "
                             f"{', '.join(sorted(ACCEPTED_PARAMS))} (error feedback is built in)")
        return cls(method, int(number(params, "rank", 4, 1, 2 ** 20, integer=True)),
                   int(number(params, "start_step", 0, 0, 2 ** 62, integer=True)),
                   float(number(params, "min_compression_rate", 2.0, 0.0, 1e12)),
                   int(number(params, "seed", 0, 0, 2 ** 62, integer=True)))

    def rank_for(self, rows: int, cols: int) -> int:
        """The rank a rows x cols matrix gets: no more than either side."""
        return min(self.rank, rows, cols)

    def compresses(self, rows: int, cols: int) -> bool:
        """Whether a rows x cols matrix travels as factors (they must be the rate smaller)."""
        r = self.rank_for(rows, cols)
        return rows > 1 and cols > 1 and rows * cols >= self.min_compression_rate * r * (rows + cols)


def is_lowrank(params: dict[str, Any]) -> bool:
    return isinstance(params, dict) and params.get("compressor") in CODECS
