"""Which compression each tensor gets: a default, rules by name pattern, a size floor.

Sources, later ones first in line: the ``[compression]`` table of the job file
(``[compression.default]`` and ``[[compression.rules]]`` with a ``pattern``), then
the ``compression_params`` / ``compression_rules`` given in code. Rules are fnmatch
patterns on the tensor's name (a parameter's name from ``named_parameters``); the
first match wins, else the default applies. Tensors below
``BYTEPS_MIN_COMPRESS_BYTES``, and tensors a codec does not accept (not float32),
travel uncompressed. Every dict is checked once, here, and becomes a ``CodecSpec``.
"""
from __future__ import annotations

import fnmatch
import tomllib

from .spec import WIDENED_DTYPES, CodecSpec


class CompressionPolicy:
    def __init__(self, default: dict | CodecSpec | None = None, rules: list[tuple[str, dict]] | None = None,
                 min_bytes: int = 0):
        self.default = CodecSpec.from_params(default, "compression default") if default else None
        # a rule's spec is None when it exempts: overridden_by hands such rules back in
        self.rules = [(pattern, _spec(params, f"compression rule {pattern!r}"))
                      for pattern, params in _pairs(rules)]
        self.min_bytes = min_bytes

    @classmethod
    def for_job(cls, settings, default: dict | None, rules: list[tuple[str, dict]] | None) -> "CompressionPolicy":
        """The job file's ``[compression]`` table with the code's ``default`` and ``rules`` over it."""
        return cls.from_job_file(settings.config_file, settings.min_compress_bytes).overridden_by(default, rules)

    @classmethod
    def from_job_file(cls, path: str, min_bytes: int) -> "CompressionPolicy":
        """The ``[compression]`` table of a TOML job file (empty policy if there is none)."""
        if not path:
            return cls(min_bytes=min_bytes)
        with open(path, "rb") as fh:
            table = tomllib.load(fh).get("compression", {})
        if not isinstance(table, dict):
            raise ValueError(f"config file {path}: compression must be a table ([compression]), got "
                             f"{type(table).__name__}")
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
        try:
            return cls(table.get("default"), rules, min_bytes)
        except ValueError as e:
            raise ValueError(f"config file {path}: [compression]: {e}") from None

    def overridden_by(self, default: dict | None, rules: list[tuple[str, dict]] | None) -> "CompressionPolicy":
        """This policy with code-given settings taking precedence."""
        return CompressionPolicy(default if default is not None else self.default,
                                 _pairs(rules) + self.rules, self.min_bytes)

    def rule_for(self, name: str) -> CodecSpec | None:
        """The spec the rules (or the default) give ``name``, before the size and dtype rules."""
        return next((s for pattern, s in self.rules if fnmatch.fnmatchcase(name, pattern)), self.default)

    def for_tensor(self, name: str, nbytes: int, dtype: str) -> CodecSpec | None:
        """This tensor's compression, or None for uncompressed (a half-precision tensor's is
        applied to it widened to float32: ``spec.WIDENED_DTYPES``)."""
        spec = self.rule_for(name)
        if spec is None or not (spec.accepts(dtype) or dtype in WIDENED_DTYPES) or nbytes < self.min_bytes:
            return None
        return spec


def _spec(params: dict | CodecSpec | None, where: str) -> CodecSpec | None:
    return None if params is None else CodecSpec.from_params(params, where)


def _pairs(rules) -> list:
    """``compression_rules`` checked: a list of (pattern, compression_params) pairs, each
    pattern a string (a dict of them, or a bare pair, used to fail with an unpacking error)."""
    if rules is None:
        return []
    if not isinstance(rules, (list, tuple)):
        hint = ": pass list(rules.items())" if isinstance(rules, dict) else ""
        raise ValueError(f"compression_rules: expected a list of (pattern, compression_params) pairs, got a "
                         f"{type(rules).__name__}{hint}")
    for i, rule in enumerate(rules):
        if not (isinstance(rule, (list, tuple)) and len(rule) == 2 and isinstance(rule[0], str)):
            raise ValueError(f"compression_rules[{i}] = {rule!r}: expected a (pattern, compression_params) pair, "
                             f"the pattern a string such as '*.bias'")
    return [tuple(rule) for rule in rules]
