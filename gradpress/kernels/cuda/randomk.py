"""random-k gather on the GPU, with no host round trip before the one copy of the payload
(k values and a NaN flag word) into a pinned host buffer.

The index set depends only on ``(n, k, stream)``, never on the data. It is built on the
host by the CPU function (``kernels.cpu.randomk.random_indices``: identical by
construction) and uploaded asynchronously on gradpress's stream, ahead of the kernel that
reads it. It is not generated on the device: Floyd's algorithm is sequential (whether
draw t lands depends on every earlier draw), and another exact rule would change the
index sets that servers and CPU workers draw. Instead, when a stream's indices are used,
those of the stream named for the next round are computed on a background thread
(``ahead``), so that a step that calls again a round later finds them ready: the host
work is off the compress's path, and only a copy of 4k bytes remains on it.
"""
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import cuda

from gradpress.kernels.cpu.randomk import random_indices
from gradpress.kernels.cuda import device, scratch, sparse_buffers
from gradpress.kernels.cuda.device import THREADS, blocks
from gradpress.kernels.cuda.elementwise import compensate_flagged

_MAX_AHEAD = 1024  # streams computed ahead and not used yet (a key that stopped is dropped)
_ahead: dict = {}  # (n, k, stream) -> Future of the host indices
_ahead_lock = threading.Lock()
_worker = ThreadPoolExecutor(1, thread_name_prefix="gradpress-randomk")
_host_staging = threading.local()  # this thread's pinned upload buffers, by k


def _host_indices(n: int, k: int, stream: np.uint64) -> np.ndarray:
    with _ahead_lock:
        future = _ahead.pop((n, k, int(stream)), None)
    return future.result() if future is not None else random_indices(n, k, stream)


def compute_ahead(n: int, k: int, stream: np.uint64) -> None:
    """Start computing the indices of ``stream`` on the background thread (the caller
    expects to use them soon); their use takes them from there."""
    with _ahead_lock:
        if (n, k, int(stream)) in _ahead:
            return
        if len(_ahead) >= _MAX_AHEAD:
            _ahead.pop(next(iter(_ahead)))
        _ahead[(n, k, int(stream))] = _worker.submit(random_indices, n, k, stream)


def device_indices(n: int, k: int, stream: np.uint64):
    """The k indices of ``stream`` on the device (uint32, increasing): reused scratch,
    written by an asynchronous copy from a reused pinned buffer. Both are free again once
    the caller has synchronised gradpress's stream (every encoder does, for its payload)."""
    staging = _host_staging.__dict__.setdefault("by_k", {})
    host = staging.get(k)
    if host is None:
        if len(staging) >= 64:
            staging.clear()
        host = staging[k] = device.pinned_host(k, np.uint32)
    host[:] = _host_indices(n, k, stream)
    indices = sparse_buffers.scratch("randomk-indices", k, np.uint32)
    indices.copy_to_device(host, stream=device.stream())
    return indices


@cuda.jit
def _gather_scaled(x, indices, scale, payload, values, epoch):
    """values[j] = float32(float64(x[i]) * scale) (``values`` views payload[:k]);
    payload[k] = ``epoch`` (this call's number, ``scratch.epoch``) on NaN/inf: an earlier
    call's flag is another number, so no launch clears it first."""
    j = cuda.grid(1)
    k = indices.shape[0]
    if j < k:
        value = np.float32(np.float64(x[indices[j]]) * scale)
        values[j] = value
        if not abs(value) < np.inf:
            payload[k] = epoch


@cuda.jit
def _take_feedback(e_out, indices, scale, payload, values, epoch):
    """``_gather_scaled`` of p = e_out, and the values taken out of it."""
    j = cuda.grid(1)
    k = indices.shape[0]
    if j < k:
        i = indices[j]
        value = np.float32(np.float64(e_out[i]) * scale)
        values[j] = value
        left = e_out[i] - value
        e_out[i] = left
        if not (abs(value) < np.inf and abs(left) < np.inf):
            payload[k] = epoch


def _payload(k: int) -> tuple:
    """The device payload (k values, then a flag word: zeroed when made, so that no call's
    epoch is found there by chance) and this call's epoch."""
    return scratch.zeroed((k + 1,), np.uint32, "randomk-payload"), scratch.epoch()


def _land(payload, k: int, reuse, epoch) -> np.ndarray | None:
    """The one copy to the host and the wait for it: the values, None on a NaN/inf."""
    host = sparse_buffers.payload(k + 1, reuse)
    payload.copy_to_host(host, stream=device.stream())
    device.stream().synchronize()
    return None if host[k] == epoch else host[:k].view(np.float32)


def gather_scaled(x, n: int, k: int, stream: np.uint64, scale: float) -> np.ndarray | None:
    """Host float32 values at the indices of ``stream``, scaled; None on a NaN/inf."""
    indices = device_indices(n, k, stream)
    payload, epoch = _payload(k)
    _gather_scaled[blocks(k), THREADS, device.stream()](x, indices, scale, payload, payload.view(np.float32), epoch)
    return _land(payload, k, None, epoch)


def gather_feedback(g, e, lam: float, e_out, n: int, k: int, stream: np.uint64, scale: float,
                    reuse=None) -> np.ndarray | None:
    """Error feedback fused into random-k: e_out = p in one checked pass, then the chosen
    values are read out and subtracted; they land in ``reuse`` (the key's previous
    payload) where it is one of ours. None when anything is not finite (e_out then holds
    garbage; it must not be e)."""
    indices = device_indices(n, k, stream)
    payload, epoch = _payload(k)
    compensate_flagged(g, e, lam, e_out, payload[k:k + 1], epoch)
    _take_feedback[blocks(k), THREADS, device.stream()](e_out, indices, scale, payload, payload.view(np.float32),
                                                        epoch)
    return _land(payload, k, reuse, epoch)
