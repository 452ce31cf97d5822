"""A random-k key without scaling, summed where its values live: k floats, not n.

Every node draws a round's k indices from the same stream ``(seed, key, round)``, so the
pushes of a round all carry values at one index set, and the server's own compression of
the aggregate picks that same set. Summing the k values of each push (float32, in
arrival order, as the dense scatter-add does at those indices) and compressing that sum
gives the bytes the dense path gives, with the server's error feedback included, as long
as its residual is zero: then p = sum + lambda * 0 at the chosen entries, p = 0 elsewhere,
the values sent are p and the new residual p - p is zero again. Without this, each round
cost the server passes over all n elements (the accumulator zeroed, then read with the
residual and written back): 0.9 ms per 1M-element partition against O(k) work.

The dense path takes over, for a round, when a push does not match (another k or seed, a
raw payload, a value decoded early) and, for good, once the residual may hold anything
else than zeros (a dense round's residual is checked; a restored one too).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..compressors import ErrorFeedback
from ..compressors.base import MAX_ELEMENTS
from ..compressors.params import keep_count
from ..compressors.randomk import RandomK, chosen_indices
from ..compressors.sparse import reject_non_finite
from ..kernels.cpu.elementwise import compensate_checked
from ..kernels.cpu.sparse import scatter


class ValuesSum:
    """The round's sum of the pushed values of one key (see the module docstring)."""

    def __init__(self, compressor: Any, codec: RandomK, key: int, count: int):
        self.compressor, self.codec = compressor, codec
        self.key, self.count = key, count
        self.k = keep_count(codec.k, count)
        self.sum = np.empty(self.k, np.float32)
        self.zeros = np.zeros(self.k, np.float32)  # the residual at the chosen entries
        self.active = False  # this round's pushes are summed here
        self.enabled = True  # the server's residual is all zero

    @classmethod
    def for_key(cls, compressor: Any, key: int, count: int) -> ValuesSum | None:
        """One for a key compressed with random-k without scaling (bare, or inside error
        feedback), whose payloads are values rather than the raw array; else None."""
        codec = compressor.inner if isinstance(compressor, ErrorFeedback) else compressor
        if not isinstance(codec, RandomK) or codec.scaling or not 0 < count <= MAX_ELEMENTS:
            return None
        if keep_count(codec.k, count) >= count:  # a raw payload: nothing to gain
            return None
        return cls(compressor, codec, key, count)

    def take(self, meta: dict, buffers: list, first: bool) -> bool:
        """Add one push's values to the round's sum; False where the dense path must take it
        (the caller then hands the round over: ``to_dense``). Raises ValueError for a
        malformed payload, checked as decompressing it checks it, before anything changes."""
        if first:
            self.active = False
        if not self.enabled or not (first or self.active):
            return False
        sent = self.codec.sent_values(meta, buffers, self.count)
        if sent is None or sent[:2] != (self.k, self.codec.seed):
            return False
        values = sent[2]
        if first:
            self.sum[:] = values
        else:
            with np.errstate(over="ignore"):  # an inf sum is refused when the round compresses
                np.add(self.sum, values, out=self.sum)
        self.active = True
        return True

    def to_dense(self, acc: np.ndarray, round: int, first: bool) -> bool:
        """The dense path takes the round from the push at hand on: the values summed so far
        go into ``acc`` (every other entry 0). Returns whether that push is still the round's
        first."""
        if first or not self.active:
            self.active = False
            return first
        scatter(chosen_indices(self.count, self.k, self.codec.seed, self.key, round), self.sum, acc, False)
        self.active = False
        return False

    def compress(self, round: int, lr: float | None) -> tuple[dict, list]:
        """The payload of the complete round: what compressing the dense sum would give.
        Raises ValueError (nothing changed) where that would refuse it."""
        out = np.empty(self.k, np.float32)
        if isinstance(self.compressor, ErrorFeedback):
            first_step = self.compressor.residual(self.key) is None
            lam = self.compressor.feedback_scale(self.key, lr)
            # the same arithmetic as the fused kernel's p = g + lam * e (first step: p = g)
            e, lam = (self.sum, 0.0) if first_step else (self.zeros, lam)
            if not compensate_checked(self.sum, e, lam, out):
                raise self.compressor.refused(self.key)
            self.compressor.record_zero_residual(self.key, self.count, lr)
        else:
            out[:] = self.sum
            reject_non_finite(out, self.codec.name)
        self.active = False
        fields = {"k": self.k, "seed": self.codec.seed, "scaled": False}
        return {"codec": self.codec.name, "n": self.count, **fields}, [out]

    def recheck(self) -> None:
        """A round went the dense way, or a checkpointed residual was installed: sum here
        from now on only while the residual is zero (bits, not values: a residual of -0.0
        makes p = -0.0 + ... differ from the sum's bits)."""
        residual = self.compressor.residual(self.key) if isinstance(self.compressor, ErrorFeedback) else None
        self.enabled = residual is None or not residual.view(np.uint32).any()
