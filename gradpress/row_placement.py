"""A row-sparse tensor's layout, and which server owns each of its rows.

A row-sparse tensor (an embedding table's gradient) of ``rows x width`` travels at row
granularity: one index and ``width`` values per touched row. Its rows are spread over
every server by a seeded hash (``kernels/rowhash.py``), Zen's answer to skew: the hot
rows of a Zipf batch land on different servers, where contiguous ranges would give the
first server most of them. Partition ``s`` of the tensor (key ``(t << 16) | s``) is
server ``s``'s share. Workers and servers build the same ``RowLayout`` from INIT_KEY's
``sparse`` field, which every worker must send alike.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .kernels.rowhash import owners, row_stream

MAX_ROWS = 1 << 40          # far beyond any table; keeps rows * width inside int64
MAX_WIDTH = 1 << 20
MAX_SEED = (1 << 63) - 1


@dataclass(frozen=True)
class RowLayout:
    rows: int
    width: int
    seed: int
    num_servers: int

    def __post_init__(self) -> None:
        for name, value, low, high in (("rows", self.rows, 0, MAX_ROWS), ("width", self.width, 1, MAX_WIDTH),
                                       ("seed", self.seed, 0, MAX_SEED), ("servers", self.num_servers, 1, 1 << 16)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"row layout: {name}={value!r} is not an integer in [{low}, {high}]")

    @property
    def count(self) -> int:
        """Elements of the dense tensor."""
        return self.rows * self.width

    @property
    def index_dtype(self) -> np.dtype:
        """Indices travel as uint32 while they fit, else as int64."""
        return np.dtype(np.uint32 if self.rows <= 1 << 32 else np.int64)

    @property
    def stream(self) -> np.uint64:
        return row_stream(self.seed)

    def owners(self, indices: np.ndarray) -> np.ndarray:
        """The server owning each row of ``indices``."""
        return owners(indices, self.seed, self.num_servers)

    def declared_parts(self) -> list[int]:
        """What the scheduler is told: one element per share. It only names the tensor
        (its id, so every worker's keys agree); a share's size changes every round and the
        layout travels in INIT_KEY, where the servers check that every worker sends it alike."""
        return [1] * self.num_servers

    def wire(self) -> dict[str, int]:
        return {"rows": self.rows, "width": self.width, "seed": self.seed, "servers": self.num_servers}

    @classmethod
    def from_wire(cls, fields: Any, what: str) -> "RowLayout":
        """The layout INIT_KEY's ``sparse`` field describes. Raises ValueError naming ``what``."""
        if not isinstance(fields, dict) or set(fields) != {"rows", "width", "seed", "servers"}:
            raise ValueError(f"{what}: the sparse layout {fields!r} must have exactly rows, width, seed, servers")
        try:
            return cls(fields["rows"], fields["width"], fields["seed"], fields["servers"])
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None


def range_owners(indices: np.ndarray, rows: int, num_servers: int) -> np.ndarray:
    """Owners under contiguous range partitioning (server s holds rows [s*R/S, (s+1)*R/S)):
    the comparison the benchmark reports beside the hash."""
    return (indices.astype(np.int64) * num_servers) // max(rows, 1)


def imbalance(owner_of_each_row: np.ndarray, num_servers: int) -> float:
    """Max over servers of the rows they receive, divided by the mean (1.0: even)."""
    counts = np.bincount(owner_of_each_row, minlength=num_servers)
    mean = counts.sum() / num_servers
    return float(counts.max() / mean) if mean else 1.0
