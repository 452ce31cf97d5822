"""random-k gather on the GPU, with no host round trip before the one copy of the payload
(k values and a NaN flag word) into a pinned host buffer.

The index set depends only on ``(n, k, stream)``, never on the data: the same set as the
CPU's Floyd draws on servers and CPU workers. Where a background thread has computed it
ahead on the host (``randomk_ahead``: a round's encode or decode starts the next round's)
it goes up in one asynchronous copy; otherwise it is drawn on the device
(``randomk_draws``). Either way it lands in reused scratch on gradpress's stream, ahead of
the kernel that reads it, and the host never waits for it.
"""
import numpy as np
from numba import cuda

from gradpress.kernels.cuda import device, randomk_ahead, randomk_draws, scratch, sparse_buffers
from gradpress.kernels.cuda.device import THREADS, blocks
from gradpress.kernels.cuda.compensation import compensated
from gradpress.kernels.cuda.elementwise import compensate_flagged
from gradpress.kernels.cuda.uploads import upload


def device_indices(n: int, k: int, stream: np.uint64, role: str = "randomk-indices"):
    """The k indices of ``stream`` on the device (uint32, increasing), in ``role``'s reused
    scratch: uploaded where computed ahead, else drawn there. Free again once the caller has
    synchronised gradpress's stream (every encoder does, for its payload)."""
    host = randomk_ahead.ready(n, k, stream)
    if host is None:
        return randomk_draws.draw(n, k, n, k, [stream], role)
    return upload(host, role)


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
        p = compensated(g[i], lam, e[i])
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
    partitions; segment s keeps ``ks[s]`` values of stream ``streams[s]``, the same number
    in every segment but the last; ``scales`` is (every segment's but the last, the last
    one's)): every segment's indices in one upload where all were computed ahead, else drawn
    at once on the device (``randomk_draws``), two launches, and
    the values back in one copy, the flags in a second
    (``scratch.copy_back_flagged``). Returns per segment
    its values (None on a NaN/inf: its part of e_out then holds garbage; e_out must not be
    e) and the pinned host array behind them (``reuse`` where it fits)."""
    n, total, segments = g.shape[0], sum(ks), len(ks)
    offsets = np.cumsum([0] + ks)
    stream = device.stream()
    ahead = [randomk_ahead.ready(min(seg_len, n - s * seg_len), k, at) for s, (k, at) in enumerate(zip(ks, streams))]
    if all(host is not None for host in ahead):  # one upload of them all
        host_indices = scratch.pinned("randomk-indices", total, np.uint32)
        for s, host in enumerate(ahead):
            np.add(host, np.uint32(s * seg_len), out=host_indices[offsets[s]:offsets[s + 1]])
        indices = scratch.grown("randomk-indices", (total,), np.uint32)
        indices.copy_to_device(host_indices, stream=stream)
    else:
        indices = randomk_draws.draw(seg_len, ks[0], n - (segments - 1) * seg_len, ks[-1], streams,
                                     "randomk-indices")
    layout = scratch.Layout(((np.float32, total),), 1)
    whole, (values,) = scratch.grown_staged("randomk-values", layout)
    flags = scratch.zeroed((segments,), np.int32, "randomk-flags")
    epoch = scratch.epoch()
    _compensate_segments[blocks(n), THREADS, stream](g, e, np.float64(lam), seg_len, e_out, flags, epoch)
    _take_segments[blocks(total), THREADS, stream](e_out, indices, seg_len, np.float64(scales[0]),
                                                   np.float64(scales[1]), segments - 1, values, flags, epoch)
    (values_host,), flags_host, host = scratch.copy_back_flagged(whole, layout, flags, reuse)
    return [None if flags_host[s] == epoch else values_host[offsets[s]:offsets[s + 1]]
            for s in range(segments)], host
