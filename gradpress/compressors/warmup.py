"""Compile, the first time on a machine, every codec kernel a node may use.

Numba compiles on first call and holds the GIL meanwhile: seconds per codec on a
cold cache (13 s for a worker's on this 2-core host). Done inside a server's engine
thread or a worker's communication thread, that would silence the node's heartbeats,
so nodes call this before they register, where no liveness clock runs yet.

Once numba's cache holds them, a kernel loads at its first call in milliseconds, after
numba's own set-up (about 0.25 s, once per process). Running the codecs then would only
pay that set-up early, in every process, including the many that never call a kernel (a
worker whose tensors travel raw): so a full warm-up leaves a list of the kernels it
compiled beside them in the cache (``_MANIFEST``), and a node skips the warm-up while
every kernel on that list is still in the cache for its current source.
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import time

import numba
import numpy as np
from numba.core.registry import CPUDispatcher

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


_MANIFEST = "gradpress-warm-up-{role}.json"   # in numba's cache directory of the kernels


def warm_up(role: str, force: bool = False) -> float:
    """Run every kernel ``role`` (worker or server) can call once, on tiny arrays, unless
    numba's cache holds each one already (``cached``) and not ``force``; returns seconds."""
    if not force and cached(role):
        log.info("kernels in numba's cache: each loads at its first call")
        return 0.0
    from . import build_compressor
    from ..kernels.cpu import server_sum as server_kernels

    start = time.perf_counter()
    x = np.linspace(-1.0, 1.0, 257, dtype=np.float32)
    for params in _CONFIGS:
        c = build_compressor(params, role)
        for rnd in range(2):  # the second round takes the error-feedback and momentum paths
            header, buffers = c.compress(x, key=1, round=rnd, lr=0.1)
            frames = [bytes(memoryview(np.ascontiguousarray(b)).cast("B")) for b in buffers]  # read-only, as received
            out = np.empty_like(x)
            c.decompress(header, frames, out, key=1, round=rnd)
            c.decompress_add(header, frames, out, key=1, round=rnd)
    if role == "server":
        for dtype in (np.float16, np.float32, np.float64):
            src = np.frombuffer(x.astype(dtype).tobytes(), dtype)
            acc = np.empty(x.size, np.float64 if dtype == np.float64 else np.float32)
            server_kernels.accumulate(acc, src, first=True)
            server_kernels.accumulate(acc, src, first=False)
        server_kernels.to_half(np.ascontiguousarray(x))
    seconds = time.perf_counter() - start
    log.info("kernels ready in %.2f s", seconds)
    _remember(role)
    return max(seconds, 1e-9)


def cached(role: str) -> bool:
    """Whether every kernel that ``role``'s last full warm-up on this machine compiled is
    in numba's cache for its current source (numba's own validity check). False where
    there is no such list, it is another numba's, or the cache cannot be read."""
    try:
        with open(_manifest_path(role)) as fh:
            manifest = json.load(fh)
        if manifest.get("numba") != numba.__version__ or not manifest.get("kernels"):
            return False
        for entry in manifest["kernels"]:
            module, name = entry.split(":")
            kernel = getattr(importlib.import_module(module), name)
            if not kernel._cache._cache_file._load_index():  # numba's: {} unless valid for this source
                return False
        return True
    except Exception:  # no list yet, or numba's cache laid out otherwise: warm up as always
        return False


def _remember(role: str) -> None:
    """List the kernels this process has compiled or loaded (the warm-up's, it being the
    first thing a node does) for ``cached``; written whole, by a rename."""
    import pkgutil
    from ..kernels import cpu
    kernels = []
    for info in pkgutil.iter_modules(cpu.__path__):
        module = importlib.import_module(f"{cpu.__name__}.{info.name}")
        kernels += [f"{module.__name__}:{name}" for name, k in sorted(vars(module).items())
                    if isinstance(k, CPUDispatcher) and k.__module__ == module.__name__ and k.signatures]
    try:
        path = _manifest_path(role)
        part = f"{path}.{os.getpid()}.part"
        with open(part, "w") as fh:
            json.dump({"numba": numba.__version__, "kernels": kernels}, fh)
        os.replace(part, path)
    except OSError as e:  # a read-only cache: every start warms up, as it did
        log.debug("could not list the warmed kernels: %s", e)


def _manifest_path(role: str) -> str:
    """Beside the kernels in numba's cache (NUMBA_CACHE_DIR, else the package's __pycache__)."""
    from ..kernels.cpu import norms
    return os.path.join(norms.square_sum._cache._cache_path, _MANIFEST.format(role=role))
