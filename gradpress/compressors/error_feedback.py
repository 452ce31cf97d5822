"""Error feedback around a codec, per key: p = g + lambda * e; c = C(p); e = p - D(c).

lambda is 1 (vanilla) or eta_{t-1} / eta_t (corrected; ``lr`` is an argument of
``compress``, and the first step of a key uses 1). Used on workers (inside Momentum) and
on servers, where g is the sum of the decompressed pushes.

The codec's own kernels do all of it where the codec has them (``fused``, the default:
one or two passes over g and e; see ``Compressor.compress_with_feedback``); otherwise, and
with ``fused=False``, the generic steps below.

Non-finite values: if p or the new residual is not finite (NaN/inf input, or a codec
overflow such as fp16 beyond 65504), compress raises ValueError and no state changes.
Returned buffers may alias this wrapper's scratch memory: they stay valid until the next
``compress`` of the same key, which writes its payload over them where the codec can (a
key's payload is sent, or served to every worker, before the key's next round starts).
"""
from typing import Any

import numpy as np

from gradpress.compressors.array_ops import check_same_layout, ops_for, to_host
from gradpress.compressors.arrays import is_device_array
from gradpress.compressors.wrapper import Wrapper
from gradpress.compressors.base import MAX_ELEMENTS, Compressor, FeedbackRefused, Header, Buffers
from gradpress.errors import NonFiniteInput

MOST_PARTITIONS = 65535  # compressed together (CUDA's limit of a grid's second dimension)


class ErrorFeedback(Wrapper):
    """Wraps a stateless ``Compressor``; offers the same compress/decompress interface.

    ``fused`` (default) runs the codec's fused kernels (``compress_with_feedback``) where it
    has them; ``fused=False`` keeps the generic steps (the reference the fused kernels are
    tested against, and the baseline of ``benchmarks/kernels.py``)."""

    def __init__(self, inner: Compressor, corrected: bool = False, fused: bool = True) -> None:
        super().__init__(inner)
        self.corrected = corrected
        self.fused = fused
        self._residuals: dict = {}  # key -> e
        self._spares: dict = {}  # key -> (p scratch or None, spare residual or None)
        self._lrs: dict = {}  # key -> learning rate of the key's previous step
        self._payloads: dict = {}  # key -> buffers of its last fused payload (reused by the next)
        # a tensor's keys compressed together (``compress_partitions``), by its first key: (the
        # residuals' one device array, each key's view of it, a spare array or None) and the
        # payloads' host array
        self._wholes: dict = {}
        self._hosts: dict = {}

    def feedback_scale(self, key: int, lr: float | None) -> float:
        """lambda for ``key``'s next step: 1, or the previous step's lr over ``lr``."""
        if not self.corrected:
            return 1.0
        if lr is None or not 0.0 < lr < float("inf"):
            raise ValueError(f"corrected error feedback needs a finite lr > 0, got {lr!r}")
        return self._lrs.get(key, lr) / lr

    def compress(self, x: Any, key: int, round: int,
                 lr: float | None = None) -> tuple[Header, Buffers]:
        ops = ops_for(x)
        g = ops.working(x)
        scale = self.feedback_scale(key, lr)
        residual = self._residuals.get(key)
        if residual is not None:
            residual = ops.adopt(residual, g)
            check_same_layout(residual, g, key, "error-feedback residual")
        compressed = self._compress_fused(ops, g, residual, scale, key, round) \
            if self.fused else None
        if compressed is None:
            compressed = self._compress_generic(ops, g, residual, scale, key, round)
        if lr is not None:
            self._lrs[key] = lr
        return compressed

    def compress_partitions(self, x: Any, keys: list, part: int, lr: float | None = None,
                            rounds: list | None = None) -> list | None:
        """All of a tensor's partitions at once: ``x`` a device array whose ``keys[i]`` is
        elements [i * part, (i + 1) * part) (the last one shorter), in ``rounds[i]`` (random-k
        draws by key and round; None: every key in round 0), compressed with one set of
        launches where the codec has them (``encode_device_partitions``). Returns per key its
        (header, buffers), or the ValueError of its refused step (NaN/inf: that key's state
        unchanged): what ``compress`` key by key would give and leave, bit for bit. The keys'
        residuals then live in one device array, so the next call reads them in place. None
        where it cannot (host input, no such kernels, residuals of keys at different steps):
        the caller compresses key by key. The payloads stay valid until the next call."""
        encode = getattr(self.inner, "encode_device_partitions", None)
        if not self.fused or encode is None or not is_device_array(x):
            return None
        ops = ops_for(x)
        g = ops.working(x)
        counts = [min(part, g.shape[0] - i * part) for i in range(len(keys))]
        # (a grid's second dimension, which top-k's kernels give the partition, has at most
        # 65,535 blocks: more partitions, as BYTEPS_PARTITION_BYTES of a few KiB make, go key by key)
        if not 2 <= len(keys) <= MOST_PARTITIONS or counts[-1] <= 0 or sum(counts) != g.shape[0] or \
                g.shape[0] > MAX_ELEMENTS or \
                any(self.inner.encoded_nbytes(c, 4) >= 4 * c for c in counts):
            return None  # (random-k indexes the whole tensor with uint32)
        try:
            scales = {self.feedback_scale(k, lr) for k in keys}
        except ValueError:
            return None  # the key-by-key path says so, key by key
        residuals = [self._residuals.get(k) for k in keys]
        first = keys[0]
        if all(r is None for r in residuals):  # the first step: p = g exactly
            e, e_views, spare, lam = g, [], None, 0.0
        elif len(scales) == 1 and all(r is not None for r in residuals):
            e, e_views, spare = self._residual_array(ops, g, keys, counts, part, residuals)
            if e is None:
                return None
            lam = scales.pop()
        else:
            return None
        # the new residuals: over the old ones where the codec checks p before it writes,
        # else into the tensor's other array with its views kept from the call before (a
        # device array's slice costs the host more than a launch); a refused partition
        # keeps its old residual
        if e is not g and self.inner.FEEDBACK_IN_PLACE:
            out, views = e, e_views
        elif spare is not None:
            out, views = spare
        else:
            out = ops.empty_like(g)
            views = self._views(out, counts, part)
        encoded, self._hosts[first] = encode(g, e, lam, out, part, self._hosts.get(first), keys,
                                             rounds if rounds is not None else [0] * len(keys))
        results: list = []
        for key, view, count, item in zip(keys, views, counts, encoded):
            if item is None:
                results.append(self.refused(key))
                continue
            fields, buffers = item
            results.append(({"codec": self.name, "n": count, **fields}, buffers))
            self._residuals[key] = view
            self._payloads.pop(key, None)  # its payload lives in the tensor's host array now
            if lr is not None:
                self._lrs[key] = lr
        refused = any(item is None for item in encoded)
        # where every key moved to ``out``, the old array is free for the next call's residuals
        self._wholes[first] = (out, views, None if refused or e is g or e is out else (e, e_views))
        return results

    @staticmethod
    def _views(whole: Any, counts: list, part: int) -> list:
        return [whole[i * part:i * part + c] for i, c in enumerate(counts)]

    def _residual_array(self, ops: Any, g: Any, keys: list, counts: list, part: int,
                        residuals: list) -> tuple[Any, list, Any]:
        """(the residuals of ``keys`` as one device array, their views of it, a spare array of
        its size with its views, or None):
        the array of the last call where they are still its views, else a new one they are
        copied into (once: a tensor compressed key by key before, one whose refused key kept
        its residual apart, or one restored from a checkpoint), the keys then reading their
        residuals there. (None, [], None) for a residual whose length is not its key's (the
        key-by-key path reports it)."""
        whole, views, spare = self._wholes.get(keys[0], (None, [], None))
        if whole is not None and len(views) == len(keys) and all(r is v for r, v in zip(residuals, views)):
            return whole, views, spare
        if any(r.shape != (c,) for r, c in zip(residuals, counts)):
            return None, [], None
        from gradpress.kernels.cuda import device
        whole = ops.empty_like(g)
        views = self._views(whole, counts, part)
        for key, view, residual in zip(keys, views, residuals):
            view.copy_to_device(ops.adopt(residual, view), stream=device.stream())
            self._residuals[key] = view
        return whole, views, None

    def refused(self, key: int) -> NonFiniteInput:
        """The error a refused step raises (also where a step is done outside ``compress``)."""
        return NonFiniteInput(f"key {key}: error feedback met NaN/inf (in the input, or the "
                          f"{self.name} codec overflowed); state left unchanged")

    def _compress_fused(self, ops: Any, g: Any, residual: Any, scale: float, key: int,
                        round: int) -> tuple[Header, Buffers] | None:
        """One call into the codec's kernels; None where it has none for this input."""
        p_scratch, spare = self._spares.get(key) or (None, None)
        in_place = residual is not None and self.inner.FEEDBACK_IN_PLACE
        e_out = residual if in_place else (spare if spare is not None else ops.empty_like(g))
        e, lam = (residual, scale) if residual is not None else (g, 0.0)  # p = g exactly
        try:
            compressed = self.inner.compress_with_feedback(g, e, lam, e_out, key, round,
                                                           self._payloads.get(key))
        except FeedbackRefused:
            raise self.refused(key) from None
        if compressed is not None:
            self._payloads[key] = compressed[1]
            self._residuals[key] = e_out
            self._spares[key] = (p_scratch, spare if in_place else residual)
        elif not in_place:
            self._spares[key] = (p_scratch, e_out)
        return compressed

    def _compress_generic(self, ops: Any, g: Any, residual: Any, scale: float, key: int,
                          round: int) -> tuple[Header, Buffers]:
        """p in scratch, C(p), D(C(p)) in scratch, the difference, the check: five passes."""
        p_scratch, decoded = self._spares.get(key) or (None, None)
        p_scratch = ops.empty_like(g) if p_scratch is None else p_scratch
        decoded = ops.empty_like(g) if decoded is None else decoded
        p = g
        if residual is not None:
            ops.add_scaled(p_scratch, g, scale, residual)
            p = p_scratch
        header, buffers = self.inner.compress(p, key, round)
        self.inner.decompress(header, buffers, decoded, key, round)
        ops.landed(decoded)  # (a GPU decodes on its landing stream; the subtract runs on the push stream)
        ops.subtract(decoded, p, decoded)
        if not ops.all_finite(decoded):
            raise self.refused(key)
        self._residuals[key] = decoded
        self._spares[key] = (p_scratch, residual)
        return header, buffers

    def record_zero_residual(self, key: int, count: int, lr: float | None) -> None:
        """A step of ``key`` done outside ``compress`` whose new residual is all zero (a
        server summing random-k values where they live: ``gradpress.server.values_sum``).
        The caller knows the residual was zero before; it stays a zero array of ``count``
        (allocated once, its pages untouched until read), and ``lr`` is noted as a step's."""
        if key not in self._residuals:
            self._residuals[key] = np.zeros(count, np.float32)
        if lr is not None:
            self._lrs[key] = lr

    def restart(self, key: int) -> None:
        """``key``'s round was skipped on every worker (some worker's input was not finite):
        its residual, which took in a step that no worker applies (or was left as it was
        where this worker refused it), goes; the next step starts from none, p = g, as a
        key's first does. Every worker does so at the same round, as low-rank's error
        buffers restart (pipeline/lowrank.py). (A tensor's residuals held in one device
        array, ``_wholes``, are gathered again at the next grouped compress.)"""
        self._residuals.pop(key, None)

    def residual(self, key: int) -> Any:
        """The current residual of ``key`` (None before its first step)."""
        return self._residuals.get(key)

    def state_dict(self) -> dict:
        """Residuals (numpy copies) and previous learning rates, per key."""
        return {"residuals": {k: to_host(v) for k, v in self._residuals.items()},
                "lrs": dict(self._lrs)}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned (host arrays; moved to a device on use)."""
        self._residuals = {k: to_host(v) for k, v in state["residuals"].items()}
        self._lrs = dict(state["lrs"])
        self._spares = {}

    def __repr__(self) -> str:
        kind = "corrected" if self.corrected else "vanilla"
        return f"ErrorFeedback({self.inner!r}, {kind})"
