"""random-k's index sets computed ahead on the host, for a GPU worker's next rounds.

A key's indices of round r + 1 depend only on ``(n, k, stream)``, known once round r is
encoded or decoded, so a background thread draws them meanwhile (Floyd's, the CPU kernel,
without the GIL) and the call a round later finds them ready: they go up in one
asynchronous copy, with no launch. A device draw (``randomk_draws``) is four to six
launches, about 0.1-0.15 ms of the communication thread's Python on a GPU machine, against
a few tens of microseconds for the copy. A call that finds them not ready (a key's first
round, or a benchmark calling rounds back to back) draws on the device instead: it never
waits, and never runs Floyd's draws on the communication thread (8.4 ms for 64M elements
at 1% on a 2-core host). An encoder and a decoder of the same round read the same entry:
entries stay until newer ones push them out.
"""
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from gradpress.kernels.cpu.randomk import random_indices

_MOST_BYTES = 64 << 20  # host indices kept: a job's keys, two rounds each, many times over
_lock = threading.Lock()
_ahead: "OrderedDict[tuple, Future]" = OrderedDict()  # (n, k, stream) -> Future of the indices
_held = 0  # bytes the entries hold
_worker = ThreadPoolExecutor(1, thread_name_prefix="gradpress-randomk")


def compute(n: int, k: int, stream: np.uint64) -> None:
    """Start drawing the indices of ``stream`` on the background thread (a call soon will
    want them), unless they are there already."""
    global _held
    key = (n, k, int(stream))
    with _lock:
        if key in _ahead:
            return
        _ahead[key] = _worker.submit(random_indices, n, k, stream)
        _held += 4 * k
        while _held > _MOST_BYTES and len(_ahead) > 1:
            (_, old_k, _), _ = _ahead.popitem(last=False)
            _held -= 4 * old_k


def ready(n: int, k: int, stream: np.uint64) -> np.ndarray | None:
    """The indices of ``stream`` (uint32, increasing, read-only: shared with other readers)
    where they were computed ahead and are done; None otherwise."""
    with _lock:
        future = _ahead.get((n, k, int(stream)))
    if future is None or not future.done():
        return None
    return future.result()
