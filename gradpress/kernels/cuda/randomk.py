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


@cuda.jit(cache=True)
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


@cuda.jit(cache=True)
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


@cuda.jit(cache=True)
def _compensate_segments(g, e, lam, seg_len, e_out, flags, epoch):
    """e_out = p = g + lam * e; flags[i // seg_len] = epoch on a NaN/inf."""
    i = cuda.grid(1)
    if i < e_out.shape[0]:
        p = g[i] + lam * e[i]
        e_out[i] = p
        if not abs(p) < np.inf:
            flags[i // seg_len] = epoch


@cuda.jit(cache=True)
def _take_segments(e_out, indices, seg_len, scale, last_scale, last, values, flags, epoch):
    """``_take_feedback`` over every segment's indices at once (each an index into the whole
    of e_out): segment s = i // seg_len scales by ``scale``, the last one (its n / k may
    differ) by ``last_scale``, and flags[s] = epoch on a NaN/inf."""
    j = cuda.grid(1)
    if j < indices.shape[0]:
        i = indices[j]
        s = i // seg_len
        value = np.float32(np.float64(e_out[i]) * (last_scale if s == last else scale))
        values[j] = value
        left = e_out[i] - value
        e_out[i] = left
        if not (abs(value) < np.inf and abs(left) < np.inf):
            flags[s] = epoch


def gather_feedback_segments(g, e, lam: float, e_out, seg_len: int, ks: list, streams: list,
                             scales: tuple, reuse) -> tuple[list, np.ndarray]:
    """``gather_feedback`` of every segment of ``seg_len`` elements of g at once (a tensor's
    partitions; segment s keeps ``ks[s]`` values of stream ``streams[s]``; ``scales`` is
    (every segment's but the last, the last one's)): one upload of all the indices, two
    launches, and the values back in one copy, the flags in a second
    (``scratch.copy_back_flagged``). Returns per segment
    its values (None on a NaN/inf: its part of e_out then holds garbage; e_out must not be
    e) and the pinned host array behind them (``reuse`` where it fits)."""
    n, total, segments = g.shape[0], sum(ks), len(ks)
    host_indices = scratch.pinned("randomk-indices", total, np.uint32)
    offsets = np.cumsum([0] + ks)
    for s, (k, stream) in enumerate(zip(ks, streams)):
        count = min(seg_len, n - s * seg_len)
        np.add(_host_indices(count, k, stream), np.uint32(s * seg_len), out=host_indices[offsets[s]:offsets[s + 1]])
    indices = scratch.grown("randomk-indices", (total,), np.uint32)
    stream = device.stream()
    indices.copy_to_device(host_indices, stream=stream)
    layout = scratch.Layout(((np.float32, total),), 1)
    whole, (values,) = scratch.grown_staged("randomk-values", layout)
    flags = scratch.zeroed((segments,), np.int32, "randomk-flags")
    epoch = scratch.epoch()
    _compensate_segments[blocks(n), THREADS, stream](g, e, np.float32(lam), seg_len, e_out, flags, epoch)
    _take_segments[blocks(total), THREADS, stream](e_out, indices, seg_len, np.float64(scales[0]),
                                                   np.float64(scales[1]), segments - 1, values, flags, epoch)
    (values_host,), flags_host, host = scratch.copy_back_flagged(whole, layout, flags, reuse)
    return [None if flags_host[s] == epoch else values_host[offsets[s]:offsets[s + 1]]
            for s in range(segments)], host
