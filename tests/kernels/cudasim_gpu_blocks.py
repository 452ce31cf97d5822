"""Run by test_gpu_blocks_cuda.py with NUMBA_ENABLE_CUDASIM=1: the kernels whose blocks the
simulator shrinks (packing's onebit and dithering encoders, topk's radix select, the norms'
one-block pairing) run at the GPU's block sizes (tests/support/gpu_block_sizes.py), over
lengths that span several of those blocks and end in a partial one, against the CPU
kernels byte for byte; prints one JSON line per case ("problem" empty when right)."""
import json
import os
import sys
import warnings

import numpy as np

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "run under the CUDA simulator"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))

import gpu_block_sizes  # noqa: E402
import simulated  # noqa: E402

simulated.prepare()  # before any kernel runs
SIZES = gpu_block_sizes.use()

from numba import cuda  # noqa: E402

from gradpress.compressors import ErrorFeedback, build_compressor  # noqa: E402
from gradpress.kernels.cuda import device, norms, packing, topk_radix  # noqa: E402
from gradpress.kernels.reduction import pairwise_total  # noqa: E402
from tests.compressors.cases import CODEC_PARAMS, gaussian, same_payload  # noqa: E402

# a whole block of the packing encoders (STAGE codes) and a partial second; three tiles
# of topk's radix select, the last partial
N = packing.STAGE + 77
# the input each codec family is checked on: ties (many equal magnitudes) for topk's tie
# rule; the sign and level encoders see nothing in them that a gaussian lacks
INPUTS = {"onebit": "gaussian", "dither": "gaussian", "topk": "ties"}


def sizes_case():
    want = {"PACK_THREADS": 256, "THREADS": 128, "TOTAL_THREADS": 256}
    got = {name: value for names in SIZES.values() for name, value in names.items() if name in want}
    yield "gpu-sizes", "" if got == want else f"block sizes {got}, not the GPU's {want}"


def codec_cases():
    assert N > 2 * topk_radix.TILE
    inputs = {"gaussian": gaussian(N, seed=1), "ties": np.round(gaussian(N, seed=2) * 2).astype(np.float32)}
    for name, params in CODEC_PARAMS:
        label = next((v for family, v in INPUTS.items() if name.startswith(family)), None)
        if label is None:
            continue
        c = build_compressor(params, "server")
        x = inputs[label]
        problem = same_payload(c.compress(x, key=3, round=4), c.compress(cuda.to_device(x), key=3, round=4))
        yield f"codec/{name}/{label}", problem


def fused_cases():
    """Error feedback fused into the packing encoders against the generic steps on the
    device, two rounds: payload and residual bytes (dithering's level table is filled in
    steps of the block's threads only with feedback). topk's fused selection runs the bare
    one's kernels, which codec_cases covers."""
    for name in ("onebit-l1", "dither-natural-max"):
        params = dict(CODEC_PARAMS)[name]
        pair = [ErrorFeedback(build_compressor(params, "server"), True, fused) for fused in (True, False)]
        problem = ""
        for round in range(2):
            g = cuda.to_device(gaussian(N, seed=10 + round))
            problem = problem or same_payload(*(c.compress(g, key=1, round=round, lr=0.1) for c in pair))
            residuals = [c.residual(1).copy_to_host().tobytes() for c in pair]
            problem = problem or ("" if residuals[0] == residuals[1] else f"residuals differ at round {round}")
        yield f"fused/{name}", problem


def partitions_cases():
    """A tensor's partitions compressed together (``compress_partitions``), each of two or
    more 256-thread packing blocks and the last of part of one, against the same compressor
    key by key: payloads and residuals, two rounds."""
    part = packing.STAGE + 301  # (dithering's 2-bit codes: a partial last byte too)
    keys = [5, 6, 7]
    for name in ("onebit-l1", "dither-linear-l2"):
        params = {**dict(CODEC_PARAMS)[name], "ef": "corrected"}
        together, apart = (build_compressor(params, "worker") for _ in range(2))
        problem = ""
        for round in range(2):
            x = gaussian(2 * part + 77, seed=20 + round)
            results = together.compress_partitions(cuda.to_device(x), keys, part, 0.1, [round] * 3) or [None] * 3
            for i, (key, result) in enumerate(zip(keys, results)):
                expected = apart.compress(cuda.to_device(x[i * part:(i + 1) * part]), key=key, round=round, lr=0.1)
                problem = problem or ("declined" if result is None else same_payload(result, expected))
                same = together.residual(key).copy_to_host().tobytes() == apart.residual(key).copy_to_host().tobytes()
                problem = problem or ("" if same else f"residuals differ at round {round}, key {key}")
        yield f"partitions/{name}", problem


def totals_cases():
    """The one-block pairing with the GPU's threads, around its switch from global to shared
    memory."""
    rng = np.random.default_rng(5)
    shared = norms._SHARED_VALUES
    for chunks in (shared - 1, shared, shared + 1, 2 * shared + 3):
        values = rng.standard_normal((2, chunks)) * 10.0 ** rng.integers(-8, 8, (2, chunks))
        largest = np.abs(rng.standard_normal(chunks))
        work = np.zeros((2, 3, chunks))
        work[0, :2], work[0, 2] = values, largest
        totals = cuda.device_array(3, np.float64)
        norms._totals[1, norms.TOTAL_THREADS, device.stream()](cuda.to_device(work), totals)
        want = np.array([pairwise_total(values[0].copy()), pairwise_total(values[1].copy()), largest.max()])
        got = totals.copy_to_host()
        yield f"totals/{chunks}", "" if got.tobytes() == want.tobytes() else f"{got} vs {want}"


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    with np.errstate(over="ignore"):  # simulated uint64 arithmetic wraps, as intended
        for source in (sizes_case, codec_cases, fused_cases, partitions_cases, totals_cases):
            for case, problem in source():
                print(json.dumps({"case": case, "problem": problem}), flush=True)
