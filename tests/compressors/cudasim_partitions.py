"""Run by test_partitions_cuda.py with NUMBA_ENABLE_CUDASIM=1: a tensor's partitions
compressed together (``ErrorFeedback.compress_partitions``) against the same compressor key
by key, on the device: headers, payload bytes and residual bytes, round after round; a
NaN in one partition refused for that key alone; a key restarted after a skipped round;
residuals restored from a checkpoint; the
inputs it must leave to the key-by-key path; and one set of launches for all the
partitions. Prints one JSON line per case ("problem" empty when right)."""
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

from gradpress.compressors import build_compressor  # noqa: E402
from gradpress.compressors.warmup import warm_up_cuda  # noqa: E402
from gradpress.kernels.cuda import norms, scratch  # noqa: E402
from gradpress.kernels.cuda.topk_radix import ABS, ESTIMATE, STATE, TILE  # noqa: E402
from gradpress.kernels.cuda.topk_segments import select_feedback_segments  # noqa: E402
from gradpress.kernels.reduction import CHUNK  # noqa: E402
from tests.compressors.cases import CODEC_PARAMS, gaussian, same_payload  # noqa: E402

# (elements, partition): partitions of a partial byte, a partial last one; and partitions of
# two chunks of kernels/reduction.py each, the second partial, the last one of part of one
SHAPES = [(701, 300), (2 * 4196 + 100, 4196)]
KEYS = [40, 41, 42]
LINE = 16  # 8-byte words in a GPU's 128-byte cache line


def pair(name: str, kind: str) -> list:
    params = {**dict(CODEC_PARAMS)[name], "ef": kind}
    return [build_compressor(params, "worker") for _ in range(2)]


def compare(together, apart, x: np.ndarray, part: int, round: int, lr: float) -> str:
    """Both ways over ``x``: '' when alike (a key refused by both counts as alike)."""
    keys = KEYS[:-(-x.shape[0] // part)]
    results = together.compress_partitions(cuda.to_device(x), keys, part, lr, [round] * len(keys))
    if results is None:
        return f"round {round}: declined"
    for i, (key, result) in enumerate(zip(keys, results)):
        chunk = cuda.to_device(x[i * part:(i + 1) * part])
        try:
            expected = apart.compress(chunk, key=key, round=round, lr=lr)
        except ValueError:
            if not isinstance(result, ValueError):
                return f"round {round} key {key}: refused key by key only"
            continue
        if isinstance(result, ValueError):
            return f"round {round} key {key}: refused together only ({result})"
        problem = same_payload(result, expected)
        if problem:
            return f"round {round} key {key}: {problem}"
        if together.residual(key).copy_to_host().tobytes() != apart.residual(key).copy_to_host().tobytes():
            return f"round {round} key {key}: residuals differ"
    return ""


def shapes(name: str, kind: str) -> list:
    """(elements, partition, rounds) for a codec's together case."""
    if name == "onebit-l2":  # it differs from l1 in its scale alone: vanilla, at both shapes, is its case
        return [(n, part, 3) for n, part in SHAPES]
    if name.startswith("dither"):  # 2- and 4-bit codes: partitions whose last byte is partial too
        return [(701, 301, 3)]
    if (name, kind) == ("topk-frac", "vanilla"):  # past selection.SAMPLE: the estimate from a strided sample
        return [(701, 300, 3), (4160, 4100, 1)]
    return [(*SHAPES[0], 3)]


def together_cases():
    for name, kinds in (("onebit-l1", ("vanilla", "corrected")), ("onebit-l2", ("vanilla",)),
                        ("fp16", ("vanilla", "corrected")), ("randomk-scaled", ("vanilla",)),
                        ("randomk", ("corrected",)), ("dither-linear-l2", ("vanilla",)),
                        ("dither-linear-max", ("corrected",)), ("dither-natural-l2", ("vanilla",)),
                        ("topk-frac", ("vanilla", "corrected"))):
        for kind in kinds:
            for n, part, rounds in shapes(name, kind):
                together, apart = pair(name, kind)
                problem = ""
                for round in range(rounds):
                    x = gaussian(n, seed=round) if round != 1 else np.round(gaussian(n, seed=9) * 2).astype(np.float32)
                    problem = problem or compare(together, apart, x, part, round, 0.1 / (1 + round))
                yield f"together/{name}/{kind}/n={n}", problem


def nan_cases():
    """A NaN in the middle partition: that key refused, its residual unchanged, the others
    go on; vanilla keeps the keys together afterwards (fp16, whose residuals go to another
    array, gathers them again first), corrected (the refused key's step is behind) leaves
    them to the key-by-key path."""
    n, part = SHAPES[0]
    for name, kinds in (("onebit-l1", ("vanilla", "corrected")), ("fp16", ("vanilla", "corrected")),
                        ("randomk", ("vanilla", "corrected")), ("dither-natural-max", ("vanilla",)),
                        ("topk-frac", ("vanilla",))):
        for kind in kinds:
            together, apart = pair(name, kind)
            problem = compare(together, apart, gaussian(n, seed=1), part, 0, 0.1)
            before = together.residual(KEYS[1]).copy_to_host()
            bad = gaussian(n, seed=2)
            bad[part + 7] = np.nan
            problem = problem or compare(together, apart, bad, part, 1, 0.05)
            if not problem and together.residual(KEYS[1]).copy_to_host().tobytes() != before.tobytes():
                problem = "the refused key's residual changed"
            if kind == "vanilla":
                for round in (2, 3):
                    problem = problem or compare(together, apart, gaussian(n, seed=round), part, round, 0.02)
            elif together.compress_partitions(cuda.to_device(gaussian(n, seed=3)), KEYS, part, 0.02, [2] * 3):
                problem = problem or "kept together with the refused key a step behind"
            yield f"nan/{name}/{kind}", problem


def restart_cases():
    """A skipped round (worker/nonfinite.py) restarts the middle key: the next call is left to
    the key-by-key path (that key has no residual, the others do), which starts it from p = g
    as a first step does; the call after gathers the residuals into one array again and gives
    the key-by-key bits."""
    n, part = SHAPES[0]
    for name, kind in (("onebit-l1", "vanilla"), ("fp16", "corrected"), ("topk-frac", "vanilla")):
        together, apart = pair(name, kind)
        problem = compare(together, apart, gaussian(n, seed=1), part, 0, 0.1)
        for c in (together, apart):
            c.restart(KEYS[1])
        x = gaussian(n, seed=2)
        if together.compress_partitions(cuda.to_device(x), KEYS, part, 0.05, [1] * 3) is not None:
            problem = problem or "compressed together with one key restarted"
        fresh = pair(name, kind)[0]
        for i, key in enumerate(KEYS):
            chunk = x[i * part:(i + 1) * part]
            got = together.compress(cuda.to_device(chunk), key=key, round=1, lr=0.05)
            problem = problem or same_payload(got, apart.compress(cuda.to_device(chunk), key=key, round=1, lr=0.05))
            if key == KEYS[1]:  # as a key never compressed before
                problem = problem or same_payload(got, fresh.compress(cuda.to_device(chunk), key=key, round=1, lr=0.05))
        for round in (2, 3):
            problem = problem or compare(together, apart, gaussian(n, seed=round), part, round, 0.02)
        yield f"restart/{name}/{kind}", problem


def restored_case():
    """Residuals from a checkpoint (host arrays, key by key) are gathered into one device
    array and give the bits the key-by-key path gives from the same checkpoint."""
    n, part = SHAPES[0]
    source = pair("onebit-l1", "corrected")[0]
    for i, key in enumerate(KEYS):
        source.compress(cuda.to_device(gaussian(n, seed=4)[i * part:(i + 1) * part]), key=key, round=0, lr=0.1)
    together, apart = pair("onebit-l1", "corrected")
    for c in (together, apart):
        c.load_state_dict(source.state_dict())
    yield "restored", compare(together, apart, gaussian(n, seed=5), part, 1, 0.05)


def declined_cases():
    """Where the key-by-key path must do it: None, and no state touched."""
    n, part = SHAPES[0]
    x = gaussian(n, seed=6)
    bare = build_compressor({"compressor": "onebit", "ef": "vanilla"}, "worker")
    cases = {"host-input": (bare, x, part), "raw-tail": (bare, x[:2 * part + 1], part),
             "momentum": (build_compressor({"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov"},
                                           "worker"), x, part)}
    mixed = build_compressor({"compressor": "onebit", "ef": "vanilla"}, "worker")
    mixed.compress(cuda.to_device(x[:part]), key=KEYS[0], round=0)
    cases["keys-at-different-steps"] = (mixed, x, part)
    for label, (c, data, size) in cases.items():
        method = getattr(c, "compress_partitions", None)
        if method is None:
            yield f"declined/{label}", "" if label == "momentum" else "no compress_partitions"
            continue
        before = {k: c.residual(k) for k in KEYS}
        got = method(data if label == "host-input" else cuda.to_device(data), KEYS, size, 0.1)
        touched = any(c.residual(k) is not before[k] for k in KEYS)
        yield f"declined/{label}", "" if got is None and not touched else "not declined, or state touched"
    # more partitions than a grid's second dimension holds (top-k's kernels give it the partition)
    many = build_compressor({"compressor": "topk", "k": 0.25, "ef": "vanilla"}, "worker")
    keys = list(range(65536))  # of 8 elements, 2 kept: the pairs are half the size
    got = many.compress_partitions(cuda.to_device(np.ones(8 * len(keys), np.float32)), keys, 8, 0.1)
    yield "declined/over-a-grids-height", "" if got is None else "compressed together"


def alternating_case():
    """Tensors of two sizes in turn, the larger first: each call's scratch is the front of
    one buffer per role that the larger made, holding the other tensor's old bytes (no
    stale flag may refuse a partition, no stale byte reach a payload), bits as key by key,
    and no buffer made anew after the first round."""
    for name in ("onebit-l1", "fp16", "randomk"):  # (dithering's and topk's grown buffers go the same way)
        tensors = [(1301, KEYS + [43, 44]), (701, [50, 51, 52])]
        together, apart = pair(name, "vanilla")
        problem, made = "", []
        for round in range(2):
            for n, keys in tensors:
                x = np.round(gaussian(n, seed=round + n) * 3).astype(np.float32)  # halves 0.0 and small ones
                results = together.compress_partitions(cuda.to_device(x), keys, 300, None, [round] * len(keys)) \
                    or [None]
                for i, (key, result) in enumerate(zip(keys, results)):
                    expected = apart.compress(cuda.to_device(x[i * 300:(i + 1) * 300]), key=key, round=round)
                    if result is None or isinstance(result, ValueError):
                        problem = problem or f"round {round} key {key}: {result or 'declined'}"
                    problem = problem or same_payload(result, expected)
            made.append({role: id(state[0]) for role, state in scratch._local.grown.items()})
        yield f"alternating/{name}", problem or ("" if made[0] == made[1] else "a buffer was made anew")


def views_kept_case():
    """fp16 writes the new residuals into the tensor's other array: from the third step on the
    two arrays take turns, and the keys' residuals are the views made at the first step."""
    n, part = SHAPES[0]
    together = pair("fp16", "vanilla")[0]
    seen = []
    for round in range(3):
        together.compress_partitions(cuda.to_device(gaussian(n, seed=round)), KEYS, part, None, [round] * 3)
        seen.append([together.residual(k) for k in KEYS])
    yield "views-kept", "" if all(a is b for a, b in zip(seen[0], seen[2])) else "views made anew"


def launches_case():
    """One norms launch and one copy back for all three partitions."""
    n, part = SHAPES[0]
    counts = {"norms": 0, "copies": 0}
    launch_totals, copy_back = norms.launch_totals, scratch.copy_back

    def counted(name, f):
        def call(*args, **kwargs):
            counts[name] += 1
            return f(*args, **kwargs)
        return call

    norms.launch_totals, scratch.copy_back = counted("norms", launch_totals), counted("copies", copy_back)
    try:
        for name in ("onebit-l1", "dither-linear-max"):
            counts.update(norms=0, copies=0)
            pair(name, "vanilla")[0].compress_partitions(cuda.to_device(gaussian(n, seed=7)), KEYS, part, None)
            yield f"one-launch-set/{name}", "" if counts == {"norms": 1, "copies": 1} else f"{counts} for 3 partitions"
    finally:
        norms.launch_totals, scratch.copy_back = launch_totals, copy_back


def lines_cases():
    """Where a segment's last block reads what the segment's other blocks wrote in the same
    launch (the norms' chunk values, top-k's tile counts), the segment's words start on a
    128-byte cache line of their own (``device.line_padded``): an SM's L1 is not coherent
    with the others' within a launch, and a line shared with another segment could be a
    stale copy there."""
    seg_len = 3 * CHUNK + 5  # four chunks a segment, the last segment two
    x = gaussian(2 * seg_len + CHUNK + 1, seed=8)
    norms.launch_totals(cuda.to_device(x), cuda.to_device(x), np.float64(0), False, seg_len)
    work = scratch.grown("norms-work", (2, 3, 3 * LINE), np.float64).copy_to_host()
    problem = ""
    for s in range(3):
        for j in range(4 if s < 2 else 2):
            chunk = x[s * seg_len + j * CHUNK:min(s * seg_len + (j + 1) * CHUNK, (s + 1) * seg_len, x.shape[0])]
            if not np.isclose(work[0, norms.ABS, s * LINE + j], np.abs(chunk.astype(np.float64)).sum()):
                problem = problem or f"segment {s} chunk {j}: not at column {s * LINE + j}"
    yield "lines/norms", problem
    seg_len, tiles = 300, -(-300 // TILE)
    x = gaussian(3 * seg_len - 50, seed=9)
    e_out = cuda.to_device(np.empty_like(x))
    select_feedback_segments(cuda.to_device(x), cuda.to_device(np.zeros_like(x)), 0.0, e_out, seg_len, 30, 25, None)
    counts = scratch.grown("segments-topk-counts", (3 * LINE,), np.int64).copy_to_host()
    state = scratch.zeroed((3 * STATE,), np.int64, "topk-segment-states").copy_to_host()
    problem = ""
    for s in range(3):
        keys = x[s * seg_len:(s + 1) * seg_len].view(np.uint32) & ABS
        reach = keys >= state[s * STATE + ESTIMATE]
        before = [int(reach[:t * TILE].sum()) for t in range(tiles)]
        if list(counts[s * LINE:s * LINE + tiles]) != before:
            problem = problem or f"segment {s}: tile offsets {list(counts[s * LINE:s * LINE + tiles])}, not {before}"
    yield "lines/topk", problem


def warm_up_cases():
    """What a GPU worker compiles: every codec's kernels, key by key and together
    (``warmup.warm_up_cuda``), launched without an error (and compiled for a GPU after, with
    the rest); and, as it trains, a codec setting's own kernels once per process, when its
    first tensor is handed over (``ready_on_gpu``): two threads handing the same new setting
    over at once build it once, a second setting is built too, ``auto`` and low-rank never."""
    import threading

    import gradpress.compressors as compressors
    from gradpress.compressors import warmup
    from gradpress.compressors.spec import CodecSpec
    from gradpress.kernels.cuda import randomk_draws
    from numba.cuda.simulator import kernel as simulated
    launched, launch = set(), simulated.FakeCUDAKernel.__call__

    def noted(self, *args):
        launched.add((self.fn.__module__, self.fn.__name__))
        return launch(self, *args)
    simulated.FakeCUDAKernel.__call__ = noted
    try:
        warm_up_cuda()
    finally:
        simulated.FakeCUDAKernel.__call__ = launch
    yield "warm-up", ""
    # a job's large random-k draw must find all its kernels compiled (on an H200 the count and
    # scan of a draw past one block compiled on the communication thread)
    draws = {(randomk_draws.__name__, name) for name, k in vars(randomk_draws).items()
             if isinstance(k, simulated.FakeCUDAKernel) and not k._device}
    missed = sorted(name for _, name in draws - launched)
    yield "warm-up/randomk-draws", f"never launched by the warm-up: {missed}" if missed else ""
    built, real = [], compressors.build_compressor
    compressors.build_compressor = lambda params, role: built.append(params["compressor"]) or real(params, role)
    try:
        x = cuda.to_device(np.ones(8, np.float32))
        onebit = CodecSpec.from_params({"compressor": "onebit", "scaling": True, "ef": "vanilla"})
        threads = [threading.Thread(target=warmup.ready_on_gpu, args=(onebit, x)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        warmup.ready_on_gpu(onebit, x)
        for params in ({"compressor": "topk", "k": 0.01, "ef": "vanilla"}, {"compressor": "auto"},
                       {"compressor": "powersgd", "rank": 2}):
            warmup.ready_on_gpu(CodecSpec.from_params(params), x)
    finally:
        compressors.build_compressor = real
    yield "warm-up/once-per-setting", "" if built == ["onebit", "topk"] else f"built {built}, not onebit then topk"


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    for source in (together_cases, nan_cases, restart_cases, restored_case, declined_cases, alternating_case,
                   views_kept_case, launches_case, lines_cases, warm_up_cases):
        for case, problem in source():
            print(json.dumps({"case": case, "problem": problem}), flush=True)
