"""Load (or, the first time on a machine, compile) every Numba kernel a node may use.

Numba compiles on first call, seconds per codec on a cold cache, and the calling thread
does nothing else meanwhile. Done inside a server's engine thread or a worker's
communication thread, that would silence the node's heartbeats, so nodes call
``warm_up`` before they register, where no liveness clock runs yet. From a warm cache it
takes a fraction of a second. A GPU worker readies each codec's CUDA kernels (compiled,
or loaded from numba's disk cache) when the first tensor of that codec is handed over, on
the thread that hands it (``ready_on_gpu``).
"""
from __future__ import annotations

import logging
import threading
import time

import numpy as np

log = logging.getLogger(__name__)

# one configuration per codec and option that selects a different kernel
_CONFIGS = [
    {"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov", "scaling": True},
    {"compressor": "onebit", "ef": "corrected", "scaling": "l2"},
    {"compressor": "topk", "k": 0.25, "ef": "vanilla"},
    {"compressor": "randomk", "k": 0.25, "ef": "vanilla", "seed": 1, "scaling": True},
    {"compressor": "dithering", "s": 7, "partition": "natural", "normalize": "max", "ef": "vanilla", "seed": 1},
    {"compressor": "dithering", "s": 3, "partition": "linear", "normalize": "l2", "seed": 1},
    {"compressor": "fp16", "ef": "vanilla"},
]


def _frames(buffers: list) -> list:
    """A payload's buffers as the bytes a pull receives (read-only)."""
    return [bytes(memoryview(np.ascontiguousarray(b)).cast("B")) for b in buffers]


def warm_up(role: str) -> float:
    """Run every kernel ``role`` (worker or server) can call once, on tiny arrays; returns seconds."""
    from . import build_compressor
    from ..kernels.cpu import fp16
    from ..kernels.cpu import server_sum as server_kernels

    start = time.perf_counter()
    x = np.linspace(-1.0, 1.0, 257, dtype=np.float32)
    for params in _CONFIGS:
        c = build_compressor(params, role)
        for rnd in range(2):  # the second round takes the error-feedback and momentum paths
            header, buffers = c.compress(x, key=1, round=rnd, lr=0.1)
            frames = _frames(buffers)
            out = np.empty_like(x)
            c.decompress(header, frames, out, key=1, round=rnd)
            c.decompress_add(header, frames, out, key=1, round=rnd)
    # a server's sums, and a worker's where it sums its machine's pushes (worker/relay.py)
    # (a frame's values are read-only, shared memory's writable: numba compiles each apart)
    for dtype in (np.float16, np.float32, np.float64):
        writable = x.astype(dtype)
        sources = (writable, np.frombuffer(writable.tobytes(), dtype))
        acc = np.empty(x.size, np.float64 if dtype == np.float64 else np.float32)
        for src in sources:
            server_kernels.accumulate(acc, src, first=True)
            server_kernels.accumulate(acc, src, first=False)
            for other in sources if dtype != np.float16 else ():
                server_kernels.sum_pair(np.empty_like(writable), src, other)
    server_kernels.to_half(np.ascontiguousarray(x))
    if role == "worker":  # the average of a pulled float16 result (worker/stages.py)
        half = x.astype(np.float16)
        fp16.divide_half(half, 3, np.empty_like(half))
    seconds = time.perf_counter() - start
    log.info("kernels ready in %.2f s", seconds)
    return seconds


def warm_up_cuda(configs: list[dict] | None = None) -> float:
    """Compile every CUDA kernel that the codecs of ``configs`` (default: every codec) may
    launch on a GPU worker, on tiny device arrays: each encoder key by key and over a
    tensor's partitions together (``compress_partitions``, kernels of their own), and its
    decoder into device memory. numba compiles a CUDA kernel at its first launch (seconds
    for a codec's set; a grouped top-k, nine kernels, took more than PS_HEARTBEAT_TIMEOUT=5
    on an H200), and the first launches would come on the communication thread, whose
    heartbeats would stop meanwhile. Returns seconds."""
    from numba import cuda

    from . import build_compressor
    from ..kernels.cuda.streams import stream

    start = time.perf_counter()
    # on the stream the encoders launch on (gradpress's, which does not wait for the legacy
    # default stream's copies), and waited for there alone, not on the whole device: the
    # caller may be the backward pass's thread, with its own kernels queued
    lane = stream()
    x = cuda.to_device(np.linspace(-1.0, 1.0, 2 * 300 + 57, dtype=np.float32), stream=lane)  # 3 partitions of 300
    out = cuda.device_array(300, np.float32, stream=lane)
    for params in _CONFIGS if configs is None else configs:
        c = build_compressor(params, "worker")
        together = getattr(c, "compress_partitions", None)
        for rnd in range(2):  # the second round reads the residuals
            if together is not None:
                together(x, [1, 2, 3], 300, 0.1, [rnd] * 3)
            header, buffers = c.compress(x[:300], key=4, round=rnd, lr=0.1)
            c.decompress(header, _frames(buffers), out, key=4, round=rnd)
        if params.get("compressor") == "randomk":  # its indices drawn past one block: two kernels more
            from ..kernels.cuda import randomk_draws
            randomk_draws.warm_up()
    lane.synchronize()
    seconds = time.perf_counter() - start
    log.info("CUDA kernels of %s ready in %.2f s", "every codec" if configs is None else
             ", ".join(str(p.get("compressor")) for p in configs), seconds)
    return seconds


_ready_on_gpu: set = set()  # the codec settings (specs) whose CUDA kernels this process has compiled
_ready_lock = threading.Lock()


def ready_on_gpu(spec, like) -> None:
    """Compile (or load from the disk cache) the CUDA kernels of ``spec`` (a ``CodecSpec``) on ``like``'s GPU, once per
    setting and process, on the calling thread: the one that hands a CUDA tensor with this
    spec over to the worker, before it does. That is the training thread (or autograd's),
    never the communication thread, which keeps sending heartbeats meanwhile (numba
    releases the GIL to it as any Python code does). Compiling every codec's kernels before
    registering cost each GPU worker 12.5 s on an H200, for seven settings of which a job
    uses one or two."""
    # (auto's and low-rank's never encode a key, and only they may hold a list; a codec's
    # checked values hash, so the spec is its own key: a lookup per push_pull)
    if spec.is_auto or spec.is_lowrank or spec in _ready_on_gpu:
        return
    from ..kernels.cuda.device import on_device_of
    with _ready_lock:  # two threads handing the same new setting over compile it once
        if spec in _ready_on_gpu:
            return
        with on_device_of(like):
            warm_up_cuda([spec.compression_params])
        _ready_on_gpu.add(spec)
