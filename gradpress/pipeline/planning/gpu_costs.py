"""A GPU worker's side of the planner's calibration (``planner/calibrate.py``, which
imports no torch): the codecs and the raw path's copies timed on CUDA tensors."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...compressors import build_compressor
from ...compressors.auto import raw_halves
from ...compressors.lowrank import CODECS as LOW_RANK
from ...compressors.lowrank import LowRankParams
from ...kernels.cuda import device as gpu
from ...planner.calibrate import SIZES, Turns, cold_keys, low_rank_cost, measure, median_s
from ...planner.fits import fit_linear
from ...planner.profile import CodecCost
from ..lowrank_math import TorchMath


def measure_on_device(params: dict[str, Any], device: Any) -> CodecCost:
    """``measure`` for a GPU worker: its compress (error feedback, encode on the device, the
    payload's copy to the host) and decompress (the payload's copy to the device, decoding
    there) on CUDA tensors, each call finished on the device before the clock stops. The
    raw path's compress is the DMA copy of the partition into pinned host memory and its
    decompress the copy back with the divide on the device, as ``worker/stages.py`` does
    them; ``fp16_raw``'s the same at float16 with the casts on the device. The servers'
    side is the host's (``measure``); a low-rank option's by ``measure_low_rank_on_device``."""
    if params.get("compressor") in LOW_RANK:
        return measure_low_rank_on_device(LowRankParams.parse(params), device)
    raw = params.get("compressor", "none") == "none"
    halves = raw_halves(params)
    host_side = measure(params)
    gen = torch.Generator(device=device).manual_seed(0)
    comp, decomp = [], []
    for n in SIZES:
        nbytes = 4 * n
        keys = cold_keys(nbytes)  # past the card's L2 cache too
        base = torch.randn(n, device=device, generator=gen)
        xs = [base * (1 + 1e-3 * j) for j in range(keys)]
        outs = [torch.zeros_like(base) for _ in range(keys)]
        # made on this thread's stream, read on gradpress's, which does not wait for it
        torch.cuda.synchronize(device)
        turn = Turns(keys)

        def finished(fn):
            def call():
                with gpu.working_on(base):
                    fn()
                torch.cuda.synchronize(device)
            return call
        if raw:
            hosts = [gpu.pinned_host(n, np.float32, base) for _ in range(2)]
            comp.append((nbytes, median_s(finished(lambda: gpu.copy_to_host_into(xs[turn()], hosts[turn.now % 2])))))
            decomp.append((nbytes, median_s(finished(lambda: gpu.land_divided(hosts[turn() % 2], outs[turn.now], 2)))))
            continue
        if halves:  # Compression.fp16's cast on the card, then the raw path's copies at half the bytes
            hosts = [gpu.pinned_host(n, np.float16, base) for _ in range(2)]
            landed = [torch.empty(n, dtype=torch.float16, device=device) for _ in range(2)]
            torch.cuda.synchronize(device)

            def land(j: int) -> None:
                gpu.land_divided(hosts[j % 2], landed[j % 2], 2)
                outs[j].copy_(landed[j % 2])
            comp.append((nbytes, median_s(finished(lambda: gpu.copy_to_host_into(xs[turn()].to(torch.float16),
                                                                                  hosts[turn.now % 2])))))
            decomp.append((nbytes, median_s(finished(lambda: land(turn())))))
            continue
        worker = build_compressor(params, "worker")
        for rnd in (0, 1):
            for j in range(keys):
                finished(lambda: worker.compress(xs[j], key=j, round=rnd, lr=0.1))()
        comp.append((nbytes, median_s(finished(lambda: worker.compress(xs[turn()], key=turn.now,
                                                                        round=2 + turn.calls, lr=0.1)))))
        with gpu.working_on(base):  # on base's device and gradpress's stream, as every call above
            header, buffers = worker.compress(base, key=keys, round=0, lr=0.1)
        frames = [bytes(memoryview(np.ascontiguousarray(b)).cast("B")) for b in buffers]
        decomp.append((nbytes, median_s(finished(lambda: worker.decompress(header, frames, outs[turn()],
                                                                            key=keys, round=0, divisor=2)))))
    return CodecCost(fit_linear(comp), fit_linear(decomp), host_side.add, host_side.payload_ratio,
                     server_compress=host_side.server_compress if host_side.server_compress is not None
                     else (None if raw else host_side.compress), uncompressed=host_side.uncompressed)


def measure_low_rank_on_device(params: LowRankParams, device: Any) -> CodecCost:
    """``calibrate.measure_low_rank`` for a GPU worker: the same steps as the reducer runs
    them there (``TorchMath``, torch ops on the step's thread and torch's current stream),
    each finished on the device before the clock stops. The servers only sum the factors:
    the host's raw path."""
    gen = torch.Generator(device=device).manual_seed(0)
    acp = params.method == "acpsgd"

    def timed(rows: int, cols: int, r: int) -> tuple[float, float, float]:
        m, p, qt = (torch.randn(shape, device=device, generator=gen) for shape in ((rows, cols), (rows, r), (r, cols)))
        e, out = torch.zeros_like(m), torch.empty_like(m)

        def finished(fn):
            def call():
                fn()
                torch.cuda.synchronize(device)
            return call
        return (median_s(finished(lambda: TorchMath.factor_rows([m], [e], [qt], [p], True, acp))),
                median_s(finished(lambda: TorchMath.factor_cols_subtract([m] if acp else None, [e], [p], [qt], acp))),
                median_s(finished(lambda: TorchMath.reconstruct([p], [qt], 0.5, [out]))))
    return low_rank_cost(params, timed)
