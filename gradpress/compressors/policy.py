"""Which compression each tensor gets: a default, rules by name pattern, a size floor.

Sources, later ones first in line: the ``[compression]`` table of the job file
(``[compression.default]`` and ``[[compression.rules]]`` with a ``pattern``), then
the ``compression_params`` / ``compression_rules`` given in code. Rules are fnmatch
patterns on the tensor's name (a parameter's name from ``named_parameters``); the
first match wins, else the default applies. Tensors below
``BYTEPS_MIN_COMPRESS_BYTES``, and tensors that are not float32, travel uncompressed.
"""
from __future__ import annotations

import fnmatch
import tomllib
from typing import Any

from . import build_compressor

NONE = "none"


class CompressionPolicy:
    def __init__(self, default: dict | None = None, rules: list[tuple[str, dict]] | None = None,
                 min_bytes: int = 0):
        self.default = _checked(default, "default") if default else None
        self.rules = [(pattern, _checked(params, f"rule {pattern!r}")) for pattern, params in rules or []]
        self.min_bytes = min_bytes

    @classmethod
    def from_job_file(cls, path: str, min_bytes: int) -> "CompressionPolicy":
        """The ``[compression]`` table of a TOML job file (empty policy if there is none)."""
        if not path:
            return cls(min_bytes=min_bytes)
        with open(path, "rb") as fh:
            table = tomllib.load(fh).get("compression", {})
        unknown = set(table) - {"default", "rules"}
        if unknown:
            raise ValueError(f"config file {path}: unknown key(s) {sorted(unknown)} in [compression]; "
                             f"accepted: default, rules")
        rules = []
        for i, rule in enumerate(table.get("rules", [])):
            if not isinstance(rule, dict) or not isinstance(rule.get("pattern"), str):
                raise ValueError(f"config file {path}: [[compression.rules]] #{i + 1} needs a string 'pattern'")
            params = {k: v for k, v in rule.items() if k != "pattern"}
            rules.append((rule["pattern"], params))
        return cls(table.get("default"), rules, min_bytes)

    def overridden_by(self, default: dict | None, rules: list[tuple[str, dict]] | None) -> "CompressionPolicy":
        """This policy with code-given settings taking precedence."""
        return CompressionPolicy(default if default is not None else self.default,
                                 list(rules or []) + self.rules, self.min_bytes)

    def for_tensor(self, name: str, nbytes: int, dtype: str) -> dict | None:
        """The compression_params for this tensor, or None for uncompressed."""
        params = next((p for pattern, p in self.rules if fnmatch.fnmatchcase(name, pattern)), self.default)
        if not params or params.get("compressor", NONE) == NONE:
            return None
        if dtype != "float32" or nbytes < self.min_bytes:
            return None
        return params


def _checked(params: Any, where: str) -> dict:
    if not isinstance(params, dict):
        raise ValueError(f"compression {where}: expected a dict of compression_params, got {type(params).__name__}")
    try:
        build_compressor(params, "worker")
    except ValueError as e:
        raise ValueError(f"compression {where}: {e}") from None
    return dict(params)
