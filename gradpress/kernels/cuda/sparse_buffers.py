"""Reused memory of the sparse encoders (top-k, random-k) on the GPU.

Device scratch (``scratch.device_array``, shared with the other encoders): allocating per
call costs a cuMemFree later, which synchronises the whole device; every launch and copy of
these encoders is on ``device.stream()``, so scratch reused by the next call on the same
thread is ordered after this call's use of it.

Pinned payloads: the one copy of a payload to the host goes by DMA into page-locked
memory. A payload handed to a caller may be kept as long as it likes, so a buffer returns
to the pool only when every array viewing it has been garbage-collected, or is written
over when the caller says that nobody reads it any more (``payload``'s ``reuse``: error
feedback passes the key's previous payload).
"""
import threading
import weakref
from typing import Any, Sequence

import numpy as np

from gradpress.kernels.cuda import device
from gradpress.kernels.cuda import scratch as reused


def scratch(role: str, count: int, dtype: Any) -> Any:
    """A device array of ``count`` ``dtype`` for ``role`` (one name per array a kernel
    sequence needs), this thread's own on the current device, the same one every call."""
    return reused.device_array((max(count, 1),), dtype, role)


_pool_lock = threading.Lock()
_pool: dict = {}  # word count -> pinned uint32 arrays whose payload views have all died


def _take_pinned(words: int) -> np.ndarray:
    with _pool_lock:
        free = _pool.get(words)
        if free:
            return free.pop()
    return device.pinned_host(words, np.uint32)


def _give_back(words: int, owner: np.ndarray) -> None:
    with _pool_lock:
        free = _pool.setdefault(words, [])
        if len(free) < 4:  # a few in flight per size; more are freed
            free.append(owner)


_ours: "weakref.WeakValueDictionary[int, np.ndarray]" = weakref.WeakValueDictionary()


def payload(words: int, reuse: Sequence[Any] | None = None) -> np.ndarray:
    """A pinned host uint32 array of ``words`` to land a payload in: the one under
    ``reuse[0]`` when that is a payload of this size from here (its readers are done),
    else one from the pool, returned to it once nothing views it any more."""
    old = reuse[0] if reuse else None
    whole = getattr(old, "base", None)
    if (isinstance(whole, np.ndarray) and whole.shape == (words,)
            and _ours.get(whole.ctypes.data) is whole):
        return whole
    owner = _take_pinned(words)
    # a view whose base is not an ndarray: numpy does not skip it, so every slice of it
    # keeps it alive, and its death means that no slice is left
    view = np.frombuffer(memoryview(owner), np.uint32)
    _ours[view.ctypes.data] = view
    weakref.finalize(view, _give_back, words, owner)
    return view
