"""Memory the GPU encoders reuse from call to call: device scratch, one allocation per
payload layout, and pinned host buffers the finished payload is copied into.

Why: a ``cuda.device_array`` per call costs an allocation, and its free (cuMemFree)
synchronises the whole device; a fresh pageable host array makes the copy back go through
the driver's bounce buffers, and a fresh pinned one costs a page-locking per call.
"""
import itertools
import sys
import threading
from typing import Any, Sequence

import numpy as np
from numba import cuda

from gradpress.kernels.cuda import device, streams

_ALIGN = 8  # bytes: every part of a layout starts at a multiple of its largest itemsize
# per thread (topk takes 9 a size): partitions come in a few sizes; a job of many is not hoarded
_MOST_ENTRIES = 256
_MOST_POOLED_SIZES = 64  # pinned host sizes the pool keeps


class Layout:
    """Buffers laid end to end in one uint8 allocation, each at a multiple of 8 bytes, so
    that kernels fill all of them on the device and one copy brings them back. The first
    ``payload`` parts are the payload's buffers; the rest are status words (a flag) that
    travel in the same copy.

    Args:
        parts: (dtype, count) per buffer, in order.
        payload: how many leading parts form the payload.
    """

    def __init__(self, parts: Sequence[tuple[Any, int]], payload: int) -> None:
        self.parts = tuple((np.dtype(dtype), int(count)) for dtype, count in parts)
        self.payload = payload
        self.offsets = []
        end = 0
        for dtype, count in self.parts:
            self.offsets.append(end)
            end += -(-dtype.itemsize * count // _ALIGN) * _ALIGN
        self.nbytes = max(end, _ALIGN)
        self.key = (self.parts, payload)

    def views(self, whole: Any) -> list:
        """Typed views of every part of ``whole`` (a host or device uint8 array of ``nbytes``)."""
        return [whole[offset:offset + dtype.itemsize * count].view(dtype)
                for offset, (dtype, count) in zip(self.offsets, self.parts)]

    def fits(self, buffers: Any, whole: Any) -> bool:
        """Whether ``buffers`` are the payload views of ``whole`` (any dtype, same bytes)."""
        if buffers is None or len(buffers) < self.payload:
            return False
        start = whole.ctypes.data
        for old, offset, (dtype, count) in zip(buffers, self.offsets, self.parts):
            if not isinstance(old, np.ndarray) or old.ctypes.data != start + offset \
                    or old.nbytes != dtype.itemsize * count:
                return False
        return True


_local = threading.local()


def _device_id() -> int:
    return streams.current_index()


def _cached(key: tuple, make) -> Any:
    """This thread's entry for ``key`` on the current device and lane. Per thread, because a
    compress owns its scratch from its first launch to its synchronize, and threads of a
    worker compress different keys at once; per lane, because a landing's decode runs on
    the landing stream beside the push stream's encoders (``streams``)."""
    cache = _local.__dict__.setdefault("entries", {})
    key = (_device_id(), streams.current_lane()) + key
    if key not in cache:
        if len(cache) >= _MOST_ENTRIES:
            cache.clear()
        cache[key] = make()
    return cache[key]


def device_array(shape: tuple, dtype: Any, role: str = "") -> Any:
    """A device array of ``shape`` (contents undefined), this thread's own, reused. ``role``
    names it apart from another of the same shape and dtype that one kernel sequence uses
    at the same time (topk's candidate indices and their keys)."""
    return _cached(("array", role, tuple(shape), np.dtype(dtype)),
                   lambda: cuda.device_array(shape, dtype, stream=device.stream()))


def zeroed(shape: tuple, dtype: Any, role: str) -> Any:
    """A device array of ``shape``, this thread's own, reused, zeroed when made: a counter
    that the kernels using it leave at 0 when they finish (``norms``' ticket)."""
    return _cached(("zeroed", role, tuple(shape), np.dtype(dtype)),
                   lambda: cuda.to_device(np.zeros(shape, dtype), stream=device.stream()))


def staged(layout: Layout) -> tuple[Any, list]:
    """(the whole uint8 device allocation, its typed views) for ``layout``, this thread's
    own, reused; zeroed when made, so a status word holds 0 or what a kernel wrote."""
    def make():
        whole = cuda.to_device(np.zeros(layout.nbytes, np.uint8), stream=device.stream())
        return whole, layout.views(whole)
    return _cached(("staged", layout.key), make)


_MOST_VIEWS = 1024  # views of a grown buffer kept (a Python object each, no device memory)


def _grown(role: str, nbytes: int) -> tuple[Any, dict]:
    """(this thread's buffer for ``role`` on the current device and lane, of at least
    ``nbytes``, made anew, larger, only when too small; the views made of it so far)."""
    buffers = _local.__dict__.setdefault("grown", {})
    key = (_device_id(), streams.current_lane(), role)
    state = buffers.get(key)
    if state is None or state[0].shape[0] < nbytes:
        state = buffers[key] = (cuda.device_array(nbytes, np.uint8, stream=device.stream()), {})
    if len(state[1]) >= _MOST_VIEWS:
        state[1].clear()
    return state


def grown(role: str, shape: tuple, dtype: Any) -> Any:
    """A device array of ``shape`` (contents undefined): the front of this thread's buffer for
    ``role`` on the current device and lane. For what comes in a size per
    tensor (a tensor's partitions encoded together), where an array kept per size
    (``device_array``, ``staged``) would keep one per tensor: this keeps one, of the largest
    tensor's size, after the first step. Views are kept too: making a device array's view
    costs the host more than the kernel launch it is for."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    buffer, views = _grown(role, max(nbytes, _ALIGN))
    view = views.get((shape, dtype))
    if view is None:
        view = views[(shape, dtype)] = buffer[:nbytes].view(dtype).reshape(shape)
    return view


def grown_staged(role: str, layout: Layout) -> tuple[Any, list]:
    """``staged`` for ``layout`` at the front of this thread's buffer for ``role`` (see
    ``grown``); nothing zeroed: every part must be written by each call's kernels."""
    buffer, views = _grown(role, layout.nbytes)
    staged_views = views.get(layout.key)
    if staged_views is None:
        whole = buffer[:layout.nbytes]
        staged_views = views[layout.key] = (whole, layout.views(whole))
    return staged_views


def pinned(role: str, count: int, dtype: Any) -> np.ndarray:
    """This thread's pinned host array for ``role`` on the current device, its first
    ``count`` elements, grown to the largest asked for: where a few words come back (a
    flag, a count) or go up, so that no call allocates host memory. Free again once the
    caller has read or copied out what it holds."""
    held = _local.__dict__.setdefault("pinned", {})
    key = (_device_id(), role, np.dtype(dtype))
    array = held.get(key)
    if array is None or array.shape[0] < count:
        array = held[key] = device.pinned_host(max(count, 1), dtype)
    return array[:count]


_epochs = itertools.count(1)


def epoch() -> np.int32:
    """A number per call for a status word: a kernel writes it where it flags a problem, so
    a flag left by an earlier call (another epoch) is never read as this call's, and no
    clearing launch is needed."""
    return np.int32(next(_epochs) % ((1 << 31) - 1) + 1)


def copy_back(whole: Any, layout: Layout, host: np.ndarray) -> list:
    """Copy ``whole`` into ``host`` on gradpress's stream, wait for it (and so for every
    kernel queued before it), and return the typed host views."""
    stream = device.stream()
    whole.copy_to_host(host, stream=stream)
    stream.synchronize()
    return layout.views(host)


def copy_back_flagged(whole: Any, layout: Layout, flags: Any, reuse: Any) -> tuple[list, np.ndarray, np.ndarray]:
    """``copy_back`` of a tensor's payloads (its partitions encoded together) into ``reuse``
    where it fits (``Reusing``), with the per-partition status words ``flags`` (a device
    int32 array apart from ``whole``: a grown buffer serves tensors of every size, and a
    flag must never read as this call's from another call's bytes) in a second copy.
    Returns (the typed host views, the host flags: this thread's, until its next call, the
    host array the views live in)."""
    flags_host = pinned("flags", flags.shape[0], np.int32)
    flags.copy_to_host(flags_host, stream=device.stream())
    host = Reusing(reuse)
    views = copy_back(whole, layout, host(layout))  # waits for both copies
    return views, flags_host, host.array


def feedback_host(layout: Layout, reuse: Any) -> np.ndarray:
    """The host buffer for a fused error-feedback payload: the one behind ``reuse`` (the
    key's previous payload, which nobody reads any more) when it has this layout, else a
    new pinned one (kept by the key through its payload's views)."""
    whole = getattr(reuse[0], "base", None) if reuse else None
    if isinstance(whole, np.ndarray) and whole.dtype == np.uint8 and whole.ndim == 1 \
            and whole.shape[0] == layout.nbytes and whole.flags.writeable \
            and layout.fits(reuse, whole):
        return whole
    return device.pinned_host(layout.nbytes, np.uint8)


class Reusing:
    """The host buffer of a tensor's payloads (its partitions encoded together): called with
    the layout, it hands out ``reuse`` (the tensor's previous one, which nobody reads any
    more) where it has the layout's size, else a new pinned one; ``array`` is what it gave."""

    def __init__(self, reuse: Any) -> None:
        self.reuse, self.array = reuse, None

    def __call__(self, layout: Layout) -> np.ndarray:
        fits = isinstance(self.reuse, np.ndarray) and self.reuse.nbytes == layout.nbytes
        self.array = self.reuse if fits else device.pinned_host(layout.nbytes, np.uint8)
        return self.array


_POOL_PER_SIZE = 4
_pool: dict = {}  # nbytes -> pinned uint8 arrays
_pool_lock = threading.Lock()


def pooled_host(nbytes: int) -> np.ndarray:
    """A pinned uint8 host array of ``nbytes`` for a payload with no owner to reuse it
    (plain ``compress``). One from the pool only when nothing but the pool refers to it:
    a payload's buffers are views whose ``base`` is the array, so while any view (or a
    memoryview or zero-copy frame of one) lives, its array is not handed out again."""
    with _pool_lock:
        arrays = _pool.setdefault(nbytes, [])
        for whole in arrays:
            # references: the pool's list, this loop's variable and getrefcount's argument
            if sys.getrefcount(whole) <= 3:
                return whole
        whole = device.pinned_host(nbytes, np.uint8)
        if len(arrays) < _POOL_PER_SIZE:
            if len(_pool) > _MOST_POOLED_SIZES:
                _pool.clear()
                _pool[nbytes] = arrays
            arrays.append(whole)
        return whole
