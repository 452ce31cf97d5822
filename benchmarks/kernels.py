"""Compression kernel throughput: Numba CPU kernels against the numpy reference, against
the machine's memory-read bandwidth, plus how long a fresh process takes to load the
compiled kernels from Numba's cache. CUDA kernels are measured too when a real GPU is
present (not under the simulator).

Error feedback, per lossy codec (vanilla, a residual already there, as in training):
``NAME_ef_compress_GBps`` the fused kernels (g and e in, payload and new e out),
``NAME_ef_generic_GBps`` the generic wrapper steps on the same input (``fused=False``),
``NAME_server_sum_GBps`` one push decoded into the fp32 aggregate (``decompress_add``),
and ``NAME_ef_bound_GBps``: the throughput the bytes the fused kernel must move allow at
the measured read (``read_GBps``) and write (``write_GBps``, a fill: it includes the
read-for-ownership) bandwidth, time = read bytes / read + written bytes / write. Bytes
per element (``EF_BYTES``): onebit and dithering read g and e twice (norm pass, then
codes pass) and write e in place: 16 read, 4 + code bytes written; randomk and topk read
g and e once and write e into its spare: 8 read, 4 written (the k chosen entries are
O(k)); fp16 reads 8 and writes e (4) and the halves (2). All figures: input bytes (fp32
gradient) per second.

    python benchmarks/kernels.py [--quick] [--reps N]

Prints a table; the last line is ``RESULT {json}``.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from numba import njit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gradpress.compressors import ErrorFeedback, build_compressor, reference  # noqa: E402
from gradpress.compressors.dithering import code_width  # noqa: E402
from results import emit as emit_result  # noqa: E402

KEY = 1
CODECS = {
    "onebit": {"compressor": "onebit", "scaling": True},
    "topk": {"compressor": "topk", "k": 0.01},
    "randomk": {"compressor": "randomk", "k": 0.01, "seed": 1},
    "dithering": {"compressor": "dithering", "s": 7, "partition": "natural", "seed": 1},
    "fp16": {"compressor": "fp16"},
    "none": {"compressor": "none"},
}


@njit(nogil=True, cache=True, fastmath=True)
def _read_all(x: np.ndarray) -> float:
    total = np.float32(0.0)
    for i in range(x.shape[0]):
        total += x[i]
    return total


@njit(nogil=True, cache=True)
def _write_all(x: np.ndarray) -> None:
    for i in range(x.shape[0]):
        x[i] = 1.0


# (bytes read, bytes written) per element by each fused error-feedback kernel
EF_BYTES = {"onebit": (16, 4 + 1 / 8), "topk": (8, 4), "randomk": (8, 4),
            "dithering": (16, 4 + code_width(7) / 8), "fp16": (8, 6)}


def ef_figures(params: dict, x: np.ndarray, reps: int) -> dict:
    """The error-feedback figures of one codec (see the module docstring)."""
    gb = x.nbytes / 1e9
    row = {}
    for label, fused in (("ef_compress_GBps", True), ("ef_generic_GBps", False)):
        ef = ErrorFeedback(build_compressor(params, "server"), fused=fused)
        ef.compress(x, key=KEY, round=0)  # the residual exists from here on
        row[label] = gb / median_seconds(lambda: ef.compress(x, key=KEY, round=1), reps)
    codec = build_compressor(params, "server")
    header, buffers = codec.compress(x, key=KEY, round=0)
    acc = np.zeros_like(x)
    row["server_sum_GBps"] = gb / median_seconds(
        lambda: codec.decompress_add(header, buffers, acc, key=KEY, round=0), reps)
    return row


def ef_bound_GBps(name: str, read_GBps: float, write_GBps: float) -> float:
    read, written = EF_BYTES[name]
    return 4 / (read / read_GBps + written / write_GBps)


def median_seconds(run, reps: int) -> float:
    run()  # warm-up: compile, page in
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def numpy_codec(name: str, x: np.ndarray, n: int):
    """(compress, decompress) closures of the numpy reference for codec ``name``."""
    k = max(1, int(np.ceil(0.01 * n)))
    width = code_width(7)
    if name == "onebit":
        payload = reference.onebit(x, "l1")
        return lambda: reference.onebit(x, "l1"), lambda: reference.onebit_decode(payload, n)
    if name == "topk":
        payload = reference.topk(x, k)
        return lambda: reference.topk(x, k), lambda: reference.pairs_decode(*payload, n)
    if name == "randomk":
        payload = reference.randomk(x, k, 1, KEY, 0, False)
        return (lambda: reference.randomk(x, k, 1, KEY, 0, False),
                lambda: reference.pairs_decode(reference.random_indices(n, k, 1, KEY, 0),
                                               payload[0], n))
    if name == "dithering":
        args = (7, True, "max", width, 1, KEY, 0)
        payload = reference.dithering(x, *args)
        return (lambda: reference.dithering(x, *args),
                lambda: reference.dithering_decode(payload, 7, True, width, n))
    if name == "fp16":
        payload = reference.fp16(x)
        return lambda: reference.fp16(x), lambda: reference.fp16_decode(payload)
    out = np.empty(n, np.float32)
    return lambda: x.copy(), lambda: np.copyto(out, x)


def gpu_compress_GBps(codec, x: np.ndarray, reps: int) -> float | None:
    from numba import config
    if config.ENABLE_CUDASIM:
        return None
    from numba import cuda
    if not cuda.is_available():
        return None
    device_x = cuda.to_device(x)

    def run():
        codec.compress(device_x, key=KEY, round=0)
        cuda.synchronize()
    return x.nbytes / median_seconds(run, reps) / 1e9


CACHE_PROBE = """
import time, numpy as np
import numba
start = time.perf_counter()
from gradpress.compressors import build_compressor
x = np.random.default_rng(0).standard_normal(50000).astype(np.float32)
acc = np.zeros_like(x)
for params in {codecs}:
    c = build_compressor(params, "server")
    h, b = c.compress(x, key=1, round=0)
    c.decompress(h, b, acc, key=1, round=0)
    c.decompress_add(h, b, acc, key=1, round=0)
print(time.perf_counter() - start)
"""


def cache_load_seconds() -> float:
    """Fresh process: import gradpress.compressors and run every kernel once (numba itself
    is imported before the clock starts)."""
    probe = CACHE_PROBE.format(codecs=list(CODECS.values()))
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    subprocess.run([sys.executable, "-c", probe], cwd=root, check=True, capture_output=True)
    run = subprocess.run([sys.executable, "-c", probe], cwd=root, check=True,
                         capture_output=True, text=True)
    return float(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16M elements instead of 64M")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    n = (16 if args.quick else 64) << 20
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    gb = x.nbytes / 1e9
    result = {"elements": n, "read_GBps": gb / median_seconds(lambda: _read_all(x), args.reps)}
    scratch = np.empty_like(x)
    result["write_GBps"] = gb / median_seconds(lambda: _write_all(scratch), args.reps)
    print(f"{n} float32 elements; memory read {result['read_GBps']:.1f} GB/s, "
          f"write {result['write_GBps']:.1f} GB/s")
    print(f"{'codec':<10} {'compress':>9} {'decomp':>9} {'np comp':>9} {'np decomp':>9} "
          f"{'ratio':>8} {'gpu comp':>9}  (GB/s of input)")
    out = np.empty(n, np.float32)
    for name, params in CODECS.items():
        codec = build_compressor(params, "server")
        header, buffers = codec.compress(x, key=KEY, round=0)
        row = {
            "compress_GBps": gb / median_seconds(
                lambda: codec.compress(x, key=KEY, round=0), args.reps),
            "decompress_GBps": gb / median_seconds(
                lambda: codec.decompress(header, buffers, out, key=KEY, round=0), args.reps),
        }
        np_compress, np_decompress = numpy_codec(name, x, n)
        numpy_reps = max(1, args.reps // 2)
        row["numpy_compress_GBps"] = gb / median_seconds(np_compress, numpy_reps)
        row["numpy_decompress_GBps"] = gb / median_seconds(np_decompress, numpy_reps)
        row["ratio"] = codec.nbytes(header, buffers) / x.nbytes
        gpu = gpu_compress_GBps(codec, x, args.reps)
        if gpu is not None:
            row["gpu_compress_GBps"] = gpu
        result.update({f"{name}_{field}": value for field, value in row.items()})
        print(f"{name:<10} {row['compress_GBps']:9.2f} {row['decompress_GBps']:9.2f} "
              f"{row['numpy_compress_GBps']:9.2f} {row['numpy_decompress_GBps']:9.2f} "
              f"{row['ratio']:8.4f} {gpu if gpu is not None else float('nan'):9.2f}")
    print(f"{'codec':<10} {'ef fused':>9} {'ef bound':>9} {'ef generic':>10} {'server sum':>10}"
          f"  (GB/s of input; vanilla error feedback)")
    for name in EF_BYTES:
        row = ef_figures(CODECS[name], x, args.reps)
        row["ef_bound_GBps"] = ef_bound_GBps(name, result["read_GBps"], result["write_GBps"])
        result.update({f"{name}_{field}": value for field, value in row.items()})
        print(f"{name:<10} {row['ef_compress_GBps']:9.2f} {row['ef_bound_GBps']:9.2f} "
              f"{row['ef_generic_GBps']:10.2f} {row['server_sum_GBps']:10.2f}")
    result["cache_load_s"] = cache_load_seconds()
    print(f"fresh process: import + first run of every kernel from the cache "
          f"{result['cache_load_s']:.3f} s")
    emit_result("kernels", {k: round(v, 4) if isinstance(v, float) else v
                           for k, v in result.items()})


if __name__ == "__main__":
    main()
