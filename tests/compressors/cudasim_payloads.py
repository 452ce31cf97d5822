"""Run by test_cuda_simulator.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 (the variable
must be set before numba is imported, which a subprocess guarantees without touching the
rest of the suite). Compresses the same small arrays through the GPU path (simulated
device arrays) and the CPU kernels, and prints one JSON line per case."""
import json
import os
import sys
import warnings

import numpy as np

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "run under the CUDA simulator"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))

import simulated  # noqa: E402

simulated.prepare()  # before any kernel runs

from numba import cuda  # noqa: E402

from gradpress.errors import NonFiniteInput  # noqa: E402
from gradpress.compressors import ErrorFeedback, build_compressor  # noqa: E402
from gradpress.compressors.arrays import is_device_array  # noqa: E402
from tests.compressors.cases import CODEC_PARAMS, gaussian, same_payload  # noqa: E402

LENGTHS = [1, 9, 300]  # raw fallback, a partial byte, several bytes and segments
KEY, ROUND = 77, 5
# the fused kernels, two rounds each: one element, and two blocks of
# kernels/cuda/device.THREADS (128) with a partial one (and a partial byte of bits). The
# simulator runs every CUDA thread as a Python thread, so each block costs about a second
# per case here (a third length, 9, cost the suite 11-22 s and covered nothing 150 does not).
FUSED_LENGTHS = (1, 150)
# the lengths each kind runs at: vanilla is corrected with lam = 1 (the same kernels, the
# same arithmetic: g + 1 * e is exact), so its blocks repeat what corrected's cover
KIND_LENGTHS = {"vanilla": FUSED_LENGTHS[:1], "corrected": FUSED_LENGTHS}


def inputs(n: int):
    yield "gaussian", gaussian(n, seed=n)
    if n > 100:  # many equal magnitudes: exercises the top-k tie rule
        yield "ties", np.round(gaussian(n, seed=n + 1) * 2).astype(np.float32)


def codec_cases():
    yield "device-path-taken", "" if is_device_array(cuda.to_device(np.zeros(3))) else \
        "simulated arrays are not recognised as device arrays: nothing below ran on the GPU path"
    for name, params in CODEC_PARAMS:
        c = build_compressor(params, "server")
        for n in LENGTHS:
            for label, x in inputs(n):
                problem = same_payload(c.compress(x, key=KEY, round=ROUND),
                                       c.compress(cuda.to_device(x), key=KEY, round=ROUND))
                yield f"{name}/n={n}/{label}", problem


def rejection_cases():
    for bad in (np.nan, np.inf, -np.inf):
        x = gaussian(50)
        x[::2] = bad  # random-k only checks the values it sends: make sure it sends one
        for name in ("onebit-l1", "topk-frac", "randomk", "dither-linear-max"):
            c = build_compressor(dict(CODEC_PARAMS)[name], "server")
            case = f"nan-rejected/{name}" + ("" if np.isnan(bad) else f"/{bad}")
            try:
                c.compress(cuda.to_device(x), key=0, round=0)
                yield case, f"no ValueError for {bad} input"
            except ValueError:
                yield case, ""
    # finite values whose l2 norm overflows float32: refused too, bare and with error feedback
    # (the residual left as it was), as on the host
    big = np.full(600, 2e37, np.float32)
    for ef in ("", "vanilla"):
        params = {**dict(CODEC_PARAMS)["dither-linear-l2"], **({"ef": ef} if ef else {})}
        c = build_compressor(params, "server")
        c.compress(cuda.to_device(gaussian(600)), key=0, round=0)
        before = c.residual(0).copy_to_host() if ef else None
        try:
            c.compress(cuda.to_device(big), key=0, round=1)
            problem = "no NonFiniteInput for an l2 norm beyond float32"
        except NonFiniteInput:
            problem = "" if not ef or c.residual(0).copy_to_host().tobytes() == before.tobytes() \
                else "the residual changed"
        yield f"nan-rejected/l2-norm-overflow/{ef or 'bare'}", problem


def wrapper_cases():
    """Worker-side ErrorFeedback with device state against the host wrapper: vanilla
    (lambda = 1), and corrected with learning rates whose ratios are not float32 values
    (0.1 / 0.07, 0.07 / 0.03): the device must round g + lambda * e where the CPU does,
    not fuse the multiply into the add."""
    kinds = [("onebit-l1", "vanilla")] + [(name, "corrected") for name in
                                          ("onebit-l1", "topk-frac", "randomk", "fp16", "dither-natural-max")]
    for name, kind in kinds:
        params = {**dict(CODEC_PARAMS)[name], "ef": kind}
        host, device = build_compressor(params, "worker"), build_compressor(params, "worker")
        problem = ""
        for round, lr in enumerate((0.1, 0.07, 0.03)):
            g = gaussian(200, seed=round)
            problem = problem or same_payload(host.compress(g, key=1, round=round, lr=lr),
                                              device.compress(cuda.to_device(g), key=1,
                                                              round=round, lr=lr))
            residual_host = host.state_dict()["residuals"][1]
            residual_device = device.state_dict()["residuals"][1]
            if not problem and residual_host.tobytes() != residual_device.tobytes():
                problem = f"residuals differ at round {round}"
        yield f"error-feedback/{name}/{kind}", problem


def compensate_cases():
    """The element-wise steps of the generic wrapper (``add_scaled``, ``compensate``) on
    the device against the CPU's, byte for byte, with a lambda that is not a float32."""
    from gradpress.compressors.array_ops import HostOps
    from gradpress.kernels.cpu import elementwise as host_kernels
    from gradpress.kernels.cuda import elementwise as device_kernels
    g, e, lam = gaussian(150, seed=7), gaussian(150, seed=8), 0.1 / 0.07
    want = np.empty(150, np.float32)
    host_kernels.compensate(g, e, lam, want)
    got = cuda.device_array(150, np.float32)
    finite = device_kernels.compensate_checked(cuda.to_device(g), cuda.to_device(e), lam, got)
    yield "compensate-checked", "" if finite and got.copy_to_host().tobytes() == want.tobytes() else \
        f"differs at {np.flatnonzero(got.copy_to_host() != want)[:5]}"
    HostOps.add_scaled(want, g, lam, e)
    device_kernels.DeviceOps.add_scaled(got, cuda.to_device(g), lam, cuda.to_device(e))
    yield "add-scaled", "" if got.copy_to_host().tobytes() == want.tobytes() else \
        f"differs at {np.flatnonzero(got.copy_to_host() != want)[:5]}"


def fused_cases():
    """Error feedback fused into the CUDA kernels against the generic steps on the same
    device (``fused=False``): payload and residual bytes, every lossy codec, both kinds;
    then a NaN in g refused with the device residual unchanged."""
    for name, params in CODEC_PARAMS:
        if name == "none":
            continue
        for kind, lengths in KIND_LENGTHS.items():
            for n in lengths:
                pair = [ErrorFeedback(build_compressor(params, "server"), kind == "corrected",
                                      fused) for fused in (True, False)]
                problem = ""
                for round in range(2):
                    g = cuda.to_device(np.round(gaussian(n, seed=round) * 2).astype(np.float32)
                                       if round else gaussian(n, seed=n))
                    lr = 0.1 / (1 + round) ** 2
                    fused, generic = (c.compress(g, key=1, round=round, lr=lr) for c in pair)
                    problem = problem or same_payload(fused, generic)
                    residuals = [c.residual(1).copy_to_host() for c in pair]
                    if not problem and residuals[0].tobytes() != residuals[1].tobytes():
                        problem = f"residuals differ at round {round}"
                yield f"fused/{name}/{kind}/n={n}", problem
        c = ErrorFeedback(build_compressor(params, "server"), True)
        c.compress(cuda.to_device(gaussian(FUSED_LENGTHS[-1], seed=1)), key=1, round=0, lr=0.1)
        before = c.residual(1).copy_to_host()
        # NaN for every codec; an infinity for two (each case costs the simulator seconds)
        for value in (np.nan,) + ((np.inf, -np.inf) if name in ("onebit-l1", "topk-frac") else ()):
            bad = gaussian(FUSED_LENGTHS[-1], seed=2)
            bad[123] = value
            try:
                c.compress(cuda.to_device(bad), key=1, round=1, lr=0.1)
                problem = f"no ValueError for {value} input"
            except ValueError:
                unchanged = c.residual(1).copy_to_host().tobytes() == before.tobytes()
                problem = "" if unchanged else "the residual changed"
            yield f"fused-nan/{name}" + ("" if np.isnan(value) else f"/{value}"), problem


CHUNKED = 2 * 4096 + 300  # three chunks of kernels/reduction.py, the last partial: an odd count
# two chunks, the second partial: where fused and generic error feedback must cross a chunk
# boundary alike (each simulated block is a second or so here: the odd count is checked once)
TWO_CHUNKS = 4096 + 300


def chunked_cases():
    """Sizes across chunk boundaries: payloads of the device reductions against the CPU's,
    fused error feedback against the generic steps (the norms of p = g + lam e, which every
    norm-scaled codec's fused kernel takes from ``norms.launch_totals``: onebit stands for
    them, each other codec costing the suite ten seconds more), then the key's payload buffer
    reused, at a size of its own per codec."""
    x = gaussian(CHUNKED, seed=3)
    x[::97] *= 1e4  # magnitudes far apart, so that another summation order gives other bits
    for name in ("onebit-l2", "dither-natural-max"):  # both norms, and the largest |p|
        c = build_compressor(dict(CODEC_PARAMS)[name], "server")
        yield f"chunks/{name}", same_payload(c.compress(x, key=KEY, round=ROUND),
                                             c.compress(cuda.to_device(x), key=KEY, round=ROUND))
    for name, n in (("onebit-l2", TWO_CHUNKS), ("dither-natural-l2", FUSED_LENGTHS[-1]), ("fp16", FUSED_LENGTHS[-1])):
        pair = [ErrorFeedback(build_compressor(dict(CODEC_PARAMS)[name], "server"), False, fused)
                for fused in (True, False)]
        problem, bases = "", []
        for round in range(2):
            g = cuda.to_device(x[:n] if round else gaussian(n, seed=4))
            fused, generic = (c.compress(g, key=1, round=round) for c in pair)
            bases.append(fused[1][-1].base)
            problem = problem or same_payload(fused, generic)
            residuals = [c.residual(1).copy_to_host() for c in pair]
            if not problem and residuals[0].tobytes() != residuals[1].tobytes():
                problem = f"residuals differ at round {round}"
        if n == TWO_CHUNKS:
            yield f"chunks-fused/{name}", problem
        yield f"payload-reused/{name}", problem or ("" if bases[0] is bases[1] else
                                                    "the key's previous payload buffer was not written over")


def pooled_payload_case():
    """A plain compress's payload stays intact while it is held, whatever compresses next."""
    c = build_compressor(dict(CODEC_PARAMS)["onebit-l1"], "server")
    first, second = gaussian(300, seed=5), gaussian(300, seed=6)
    held = c.compress(cuda.to_device(first), key=KEY, round=ROUND)
    c.compress(cuda.to_device(second), key=KEY, round=ROUND)
    yield "pooled-payload-held", same_payload(held, c.compress(first, key=KEY, round=ROUND))


def decompress_case():
    c = build_compressor(dict(CODEC_PARAMS)["topk-frac"], "server")
    x = gaussian(100)
    header, buffers = c.compress(x, key=0, round=0)
    on_host = np.empty(100, np.float32)
    c.decompress(header, buffers, on_host, key=0, round=0)
    on_device = cuda.device_array(100, np.float32)
    c.decompress(header, buffers, on_device, key=0, round=0)
    yield "decompress-to-device", "" if np.array_equal(on_device.copy_to_host(), on_host) \
        else "device output differs"


def device_decode_cases():
    """Every codec decoded into a device array (on the GPU where it has a device decoder,
    else on the host and copied) gives the host decoder's bytes, averaged or not, at a
    partial byte, a partial block and two blocks; a malformed payload is refused alike."""
    for name, params in CODEC_PARAMS:
        c = build_compressor(params, "server")
        for n in (9, 150, 300):
            for divisor in (1, 3):
                header, buffers = c.compress(gaussian(n, seed=n), key=KEY, round=ROUND)
                on_host = np.empty(n, np.float32)
                c.decompress(header, buffers, on_host, key=KEY, round=ROUND, divisor=divisor)
                on_device = cuda.device_array(n, np.float32)
                c.decompress(header, buffers, on_device, key=KEY, round=ROUND, divisor=divisor)
                got = on_device.copy_to_host()
                yield f"device-decode/{name}/{n}/{divisor}", "" if got.tobytes() == on_host.tobytes() \
                    else f"differs at {np.flatnonzero(got != on_host)[:5]}"
        header, buffers = c.compress(gaussian(300, seed=1), key=KEY, round=ROUND)
        short = [np.asarray(b)[:1] for b in buffers]
        problems = []
        for out in (np.empty(300, np.float32), cuda.device_array(300, np.float32)):
            try:
                c.decompress(header, short, out, key=KEY, round=ROUND)
                problems.append("accepted")
            except ValueError:
                problems.append("ValueError")
        yield f"device-decode-refused/{name}", "" if problems == ["ValueError"] * 2 or "raw" in header \
            else f"host/device: {problems}"


def raw_fallback_cases():
    """A compressed key whose payload went raw (its encoding would not be smaller: top-k of
    3/4 of the elements) lands in a device array as its float32 values, divided there: the
    host decoder's bytes, without a decode on the host and a blocking copy of the result."""
    from gradpress.kernels.cuda import device
    c = build_compressor({"compressor": "topk", "k": 0.75}, "server")
    header, buffers = c.compress(gaussian(150, seed=9), key=KEY, round=ROUND)
    blocking, real = [], device.copy_from_host
    device.copy_from_host = lambda host, out: (blocking.append(host.shape), real(host, out))
    try:
        for divisor in (1, 3):
            on_host, on_device = np.empty(150, np.float32), cuda.device_array(150, np.float32)
            c.decompress(header, buffers, on_host, key=KEY, round=ROUND, divisor=divisor)
            c.decompress(header, buffers, on_device, key=KEY, round=ROUND, divisor=divisor)
            got = on_device.copy_to_host()
            problem = "" if "raw" in header else "the payload did not go raw"
            problem = problem or ("" if got.tobytes() == on_host.tobytes() else
                                  f"differs at {np.flatnonzero(got != on_host)[:5]}")
            yield f"raw-fallback/{divisor}", problem or ("" if not blocking else "decoded on the host, copied blocking")
    finally:
        device.copy_from_host = real


def topk_kernel_cases():
    """The device top-k against the CPU's full selection at its edges: ties at the
    threshold, all equal, k near n, tiny n, and the estimate off (the fallback)."""
    from gradpress.kernels.cpu import topk as cpu_topk
    from gradpress.kernels.cuda import topk as gpu_topk
    ties = np.round(gaussian(300, seed=3) * 2).astype(np.float32)
    spikes = np.zeros(300, np.float32)
    spikes[::97] = 1.0  # 4 non-zeros: k > 4 keeps zeros, lowest indices first
    cases = [("ties-at-threshold", ties, 37), ("all-equal", np.full(200, -1.5, np.float32), 50),
             ("k-near-n", gaussian(70, seed=4), 69), ("k-is-n", gaussian(70, seed=5), 70),
             ("tiny-n", gaussian(2, seed=6), 1), ("n-1", gaussian(1, seed=7), 1),
             ("zeros-and-signed-zero", np.array([0.0, -0.0, 0.0, 1.0], np.float32), 2),
             ("fallback-spikes", spikes, 20)]
    for label, x, k in cases:
        want_indices, want_values = np.empty(k, np.uint32), np.empty(k, np.float32)
        cpu_topk.select_topk(x, want_indices, want_values)
        indices, values = gpu_topk.select_topk(cuda.to_device(x), k)
        problem = "" if indices.tobytes() == want_indices.tobytes() and \
            values.tobytes() == want_values.tobytes() else f"indices {indices[:8]} want {want_indices[:8]}"
        yield f"topk-kernel/{label}", problem
    x = gaussian(150, seed=8)
    x[77] = np.nan
    try:
        gpu_topk.select_topk(cuda.to_device(x), 10)
        yield "topk-kernel/nan", "no ValueError for NaN input"
    except ValueError:
        yield "topk-kernel/nan", ""


def sparse_feedback_cases():
    """top-k and random-k with error feedback over several rounds on the device: the
    payload lands in the key's previous pinned buffer (``reuse``), bytes equal the host
    wrapper's; a NaN later is refused with the residual unchanged."""
    for name in ("topk-frac", "topk-count", "randomk-scaled"):
        params = {**dict(CODEC_PARAMS)[name], "ef": "vanilla"}
        host, device = build_compressor(params, "worker"), build_compressor(params, "worker")
        problem, addresses = "", set()
        for round in range(3):
            g = np.round(gaussian(150, seed=round) * 2).astype(np.float32)
            sent = device.compress(cuda.to_device(g), key=2, round=round)
            problem = problem or same_payload(host.compress(g, key=2, round=round), sent)
            addresses.add(sent[1][0].ctypes.data)
        if not problem and len(addresses) != 1:
            problem = f"payload not written over the previous one: {len(addresses)} buffers"
        before = device.state_dict()["residuals"][2]
        bad = gaussian(150, seed=9)
        bad[3] = np.nan
        try:
            device.compress(cuda.to_device(bad), key=2, round=3)
            problem = problem or "no ValueError for NaN input"
        except ValueError:
            if device.state_dict()["residuals"][2].tobytes() != before.tobytes():
                problem = problem or "the residual changed"
        # the refused round's flag is still in the device payload: the next round is not refused
        g = np.round(gaussian(150, seed=4) * 2).astype(np.float32)
        try:
            problem = problem or same_payload(host.compress(g, key=2, round=4),
                                              device.compress(cuda.to_device(g), key=2, round=4))
        except ValueError:
            problem = problem or "the round after a refused one was refused too"
        yield f"sparse-feedback/{name}", problem


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    with np.errstate(over="ignore"):
        for source in (codec_cases, rejection_cases, wrapper_cases, compensate_cases, decompress_case,
                       device_decode_cases, raw_fallback_cases, fused_cases, topk_kernel_cases,
                       sparse_feedback_cases, chunked_cases, pooled_payload_case):
            for case, problem in source():
                print(json.dumps({"case": case, "problem": problem}), flush=True)
