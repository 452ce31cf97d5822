"""What each compression option costs on this host: a short calibration, cached.

Each option is timed at a few sizes on the real kernels, as a worker runs them (error
feedback and encode; decode into the output) and as a server does (decode one push into
the fp32 sum); a least-squares line through the medians gives its ``LinearCost``. The raw
path ``none`` is timed as the worker's copy-and-divide of a reply and the server's sum.

Every timed call works on memory the calls before it have pushed out of the caches (a
key of its own, among enough keys to fill ``COLD_BYTES``), as in a job, where a
partition's gradient, residual and output were last touched a step ago. Timed over and
over on one input, in cache, onebit's fused compress of 4 MB took half as long.
The result is cached per host, gradpress version, kernel source and option
(``~/.cache/gradpress``, or ``GRADPRESS_CACHE_DIR``), so a second job on the host starts
without recalibrating.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import __version__
from ..compressors import build_compressor
from ..compressors.auto import HALVES
from ..compressors.lowrank import CODECS as LOW_RANK
from ..compressors.lowrank import LowRankParams
from ..kernels.cpu import fp16, lowrank, server_sum
from ..server.values_sum import ValuesSum
from .fits import fit_linear
from .profile import CodecCost, LinearCost

SIZES = (1 << 14, 1 << 18, 1 << 20)   # elements: 64 KB, 1 MB, 4 MB of fp32
REPEATS = 5
COLD_BYTES = 96 << 20   # the keys a size cycles through hold this much: past a 32 MB L3 cache
MATRICES = ((128, 512), (512, 512), (512, 2048))   # low-rank options: 256 KB, 1 MB, 4 MB


def cache_path(name: str, params: dict[str, Any], card: str = "") -> Path:
    root = Path(os.environ.get("GRADPRESS_CACHE_DIR") or Path.home() / ".cache" / "gradpress")
    digest = hashlib.sha256(json.dumps([name, params, kernels_digest(), card],
                                       sort_keys=True).encode()).hexdigest()[:16]
    return root / f"codec-{socket.gethostname()}-{__version__}-{digest}.json"


@functools.cache
def kernels_digest() -> str:
    """A digest of the codecs' and kernels' source: a changed kernel is measured again even
    where the version number did not move (a development tree, a patched install)."""
    h = hashlib.sha256()
    for path in measured_sources():
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def measured_sources() -> list[Path]:
    """The codecs' and kernels' modules, and those that time them (a change in how the costs
    are timed is measured again)."""
    package = Path(__file__).resolve().parent.parent
    return sorted([*(package / "compressors").glob("*.py"), *(package / "kernels").rglob("*.py"),
                   Path(__file__).resolve(), package / "pipeline" / "planning" / "gpu_costs.py"])


def codec_costs(options: dict[str, dict[str, Any]], on_device: Callable[[dict], CodecCost] | None = None,
                card: str = "") -> dict[str, CodecCost]:
    """Costs of every option (and of the raw path ``none``), from the cache or measured now:
    on the host, or by ``on_device`` (a GPU worker's, ``pipeline/planning/gpu_costs.py``;
    this package imports no torch) cached under the name of its ``card``."""
    out = {}
    for name, params in {**options, "none": {"compressor": "none"}}.items():
        path = cache_path(name, params, card)
        try:
            out[name] = CodecCost.from_dict(json.loads(path.read_text()))
            continue
        except (OSError, ValueError, KeyError, TypeError):
            pass
        out[name] = measure(params) if on_device is None else on_device(params)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(asdict(out[name])))
        except OSError:
            pass  # a read-only home only costs the next job a calibration
    return out


def measure(params: dict[str, Any]) -> CodecCost:
    if params.get("compressor") in LOW_RANK:
        return measure_low_rank(LowRankParams.parse(params))
    if params.get("compressor") == HALVES:
        return measure_halves()
    raw = params.get("compressor", "none") == "none"
    rng = np.random.default_rng(0)
    comp, decomp, add, recompress, ratio = [], [], [], [], 1.0
    for n in SIZES:
        nbytes = 4 * n
        keys, base, xs = cold_inputs(rng, n)
        outs, accs = [np.zeros_like(base) for _ in range(keys)], [np.zeros_like(base) for _ in range(keys)]
        turn = Turns(keys)
        if raw:
            decomp.append((nbytes, median_s(lambda: np.divide(xs[turn()], 2.0, out=outs[turn.now]))))
            add.append((nbytes, median_s(lambda: server_sum.accumulate(accs[turn()], xs[turn.now], first=False))))
            continue
        worker, server = build_compressor(params, "worker"), build_compressor(params, "server")
        for rnd in (0, 1):  # every key's residual (and spare) exists before the timing
            for j in range(keys):
                worker.compress(xs[j], key=j, round=rnd, lr=0.1)
        comp.append((nbytes, median_s(lambda: worker.compress(xs[turn()], key=turn.now, round=2 + turn.calls,
                                                               lr=0.1))))
        header, buffers = worker.compress(base, key=keys, round=0, lr=0.1)
        frames = [bytes(memoryview(np.ascontiguousarray(b)).cast("B")) for b in buffers]
        decomp.append((nbytes, median_s(lambda: worker.decompress(header, frames, outs[turn()], key=keys, round=0))))
        sums = ValuesSum.for_key(server, keys, n)
        if sums is None:
            add.append((nbytes, median_s(lambda: server.decompress_add(header, frames, accs[turn()], key=keys,
                                                                        round=0))))
        else:  # the server sums k values per push and recompresses them (server/values_sum.py)
            sums.take(header, frames, first=True)
            add.append((nbytes, median_s(lambda: sums.take(header, frames, first=False))))
            recompress.append((nbytes, median_s(lambda: (sums.take(header, frames, first=True),
                                                           sums.compress(1, 0.1)))))
        ratio = sum(len(f) for f in frames) / nbytes
    zero = LinearCost(0.0, 0.0)
    return CodecCost(zero if raw else fit_linear(comp), fit_linear(decomp), fit_linear(add), ratio,
                     server_compress=fit_linear(recompress) if recompress else None)


def measure_low_rank(params: LowRankParams) -> CodecCost:
    """A low-rank option's work per step on the training thread, per matrix byte, as
    ``pipeline/lowrank.py`` does it on a CPU: the factor products with the error update
    (ACP-SGD: the mean of a P step and a Q step; PowerSGD: both), and the reconstruction.
    The servers only sum the factors (the raw path's cost)."""
    rng = np.random.default_rng(0)
    acp = params.method == "acpsgd"

    def timed(rows: int, cols: int, r: int) -> tuple[float, float, float]:
        m = rng.standard_normal((rows, cols)).astype(np.float32)
        e, out = np.zeros_like(m), np.empty_like(m)
        p = rng.standard_normal((rows, r)).astype(np.float32)
        qt = rng.standard_normal((r, cols)).astype(np.float32)

        def q_step():
            lowrank.factor_cols(m, e, p, qt, acp)
            lowrank.subtract_product(m, e, p, qt, acp)
        return (median_s(lambda: lowrank.factor_rows(m, e, qt, p, True, acp)), median_s(q_step),
                median_s(lambda: lowrank.reconstruct(p, qt, 0.5, out)))
    return low_rank_cost(params, timed)


def low_rank_cost(params: LowRankParams, timed: Callable[[int, int, int], tuple[float, float, float]]) -> CodecCost:
    """A low-rank option's cost from ``timed(rows, cols, rank)``: the seconds of one such
    matrix's P step, Q step and reconstruction (on a host, or a GPU worker's device)."""
    comp, decomp = [], []
    for rows, cols in MATRICES:
        p_s, q_s, rebuild_s = timed(rows, cols, min(params.rank, rows, cols))
        comp.append((4 * rows * cols, p_s + q_s if params.method == "powersgd" else (p_s + q_s) / 2))
        decomp.append((4 * rows * cols, rebuild_s))
    raw = measure({"compressor": "none"})
    return CodecCost(fit_linear(comp), fit_linear(decomp), raw.add, 0.0, params.rank,
                     2 if params.method == "powersgd" else 1, params.min_compression_rate)


def measure_halves() -> CodecCost:
    """``fp16_raw`` (``Compression.fp16``'s way) on a host: the worker casts to float16
    and lands the sum as the raw path does a float16 key (the divide in float32, rounded
    once, then widened back to float32); a server adds each push's halves into its fp32 sum
    and rounds the sum to float16 once a round (its reply). The worker's casts are torch's
    in a job; here the server's loops with the CPU's conversions stand for them (4 MB:
    0.07 ms each way against torch's 0.05, where the software loops took 0.26-0.42)."""
    rng = np.random.default_rng(0)
    comp, decomp, add, reply = [], [], [], []
    for n in SIZES:
        nbytes = 4 * n
        keys, base, xs = cold_inputs(rng, n)
        halves = [x.astype(np.float16) for x in xs]
        outs, accs = [np.zeros_like(base) for _ in range(keys)], [np.zeros_like(base) for _ in range(keys)]
        landed = [np.empty(n, np.float16) for _ in range(keys)]
        turn = Turns(keys)

        def land(j: int) -> None:
            fp16.divide_half(halves[j], 2, landed[j])
            fp16.sum_half_bits(landed[j].view(np.uint16), outs[j], first=True)
        comp.append((nbytes, median_s(lambda: fp16.round_half_bits(xs[turn()], landed[turn.now].view(np.uint16)))))
        decomp.append((nbytes, median_s(lambda: land(turn()))))
        add.append((nbytes, median_s(lambda: server_sum.accumulate(accs[turn()], halves[turn.now], first=False))))
        reply.append((nbytes, median_s(lambda: server_sum.to_half(accs[turn()], landed[turn.now]))))
    return CodecCost(fit_linear(comp), fit_linear(decomp), fit_linear(add), 0.5, server_compress=fit_linear(reply),
                     uncompressed=True)


def cold_keys(nbytes: int) -> int:
    """How many keys of ``nbytes`` a timing cycles through: enough that each call finds its
    input, residual and output out of cache, at least the repeats and a spare."""
    return max(REPEATS + 2, -(-COLD_BYTES // (3 * nbytes)))


def cold_inputs(rng: np.random.Generator, n: int) -> tuple[int, np.ndarray, list[np.ndarray]]:
    """``cold_keys`` of ``n`` float32 elements: their count, the base and each key's input."""
    keys = cold_keys(4 * n)
    base = rng.standard_normal(n).astype(np.float32)
    return keys, base, [base * np.float32(1 + 1e-3 * j) for j in range(keys)]


class Turns:
    """The next of ``count`` keys, in turn (``now``: the one just handed out)."""

    def __init__(self, count: int):
        self.count, self.calls, self.now = count, 0, 0

    def __call__(self) -> int:
        self.calls += 1
        self.now = self.calls % self.count
        return self.now


def median_s(fn) -> float:
    fn()  # first call: compiled kernels load, buffers fault in
    times = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)

