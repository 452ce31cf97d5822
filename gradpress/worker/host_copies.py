"""Copies from a GPU to the host, queued by the communication thread and waited for off it.

A CUDA chunk's raw values reach the host by an asynchronous DMA copy on gradpress's stream
(``device.copy_to_host_queued``), which the device orders after the gradient's producer.
So the host would wait for the backward pass to get that far, and a synchronous copy held
the communication thread meanwhile: on an H200 it spent 12 ms of a 47 ms uncompressed step
blocked in copies to the host, sending and landing nothing. Now it queues the copy and goes
on; a thread of this module's waits for each copy's event in the order they were queued
(one stream: they finish in that order) and hands what comes next (the partition's push and
pull, or the owner's local sum) back to the communication thread, which runs it at its next
turn of the loop (``run_finished``), woken through its pipe. One partition's copy overlaps
the push of the one before, as BytePS's copy and push loops do.

A compressed CUDA chunk's encoder ends in the same wait: its payload's copy to the host,
whose sizes and NaN flags the host must read before the push. So the whole compress (its
launches, the copy and that wait) runs on this module's thread too (``run``), in the same
queue: the communication thread lands and sends meanwhile, and the launches keep the order
in which the partitions were handed over. A partition whose source is a pinned host buffer
that an asynchronous copy off the GPU is still filling (``torch/staging.py``: bfloat16,
integer and non-contiguous CUDA tensors) waits here for that copy's event too (``after``),
where the communication thread used to block in it.

What a step comes to is not this thread's to decide: an operation waits here no longer than
its deadline allows, after which it is failed (``flight.py``) and its late turn does nothing.
"""
from __future__ import annotations

import collections
import functools
import logging
import queue
import sys
import threading
import time
from typing import Any, Callable

log = logging.getLogger(__name__)


class HostCopies:
    def __init__(self, wake: Callable[[], None]):
        self._wake = wake                         # the communication thread's pipe
        self._queued: queue.SimpleQueue = queue.SimpleQueue()
        self._finished: collections.deque = collections.deque()
        self._thread: threading.Thread | None = None
        self._closed = False

    def copy(self, chunk: Any, host: Any, then: Callable[[], None], what: Callable[[], str] | None = None) -> None:
        """Queue ``host[:] = chunk`` (a CUDA chunk, on gradpress's stream of its device) and
        run ``then`` on the communication thread once it is done (``after``)."""
        from ..kernels.cuda import device
        with device.working_on(chunk):
            done = device.copy_to_host_queued(chunk, host)
        self.after(done, then, functools.partial(device.copied, done, chunk), what)

    def after(self, done: Any, then: Callable[[], None], waited: Callable[[], None] | None = None,
              what: Callable[[], str] | None = None) -> None:
        """Run ``then`` on the communication thread once ``done`` (an event recorded after
        a queued copy) has happened: at once where it has already (a copy from pageable
        memory, which the driver finishes before returning), else after every earlier
        pending one's, from ``run_finished``. ``waited``, where given, runs first, on the
        thread that saw it happen (the event's owner reuses it). ``what`` says what the copy
        is of (a partition's ``WorkerKey.describe``), called only where the copy failed."""
        query = getattr(done, "query", None)  # (the simulator's events have none)
        if query is not None and _queried(done):
            if waited is not None:
                waited()
            then()  # no hand-off through the thread and the pipe: its latency would be all it adds
            return
        self._put(done, None, then, waited, what)

    def run(self, work: Callable[[], Any], then: Callable[[Any], None]) -> None:
        """Call ``work`` on this module's thread, after every copy and work queued before it
        (a compress of a CUDA chunk: launches on gradpress's stream, then a wait for its
        payload's copy), and ``then(what it returned)`` on the communication thread. What
        ``work`` raises is raised there instead."""
        self._put(None, work, then)

    def _put(self, done: Any, work: Any, then: Callable, waited: Callable[[], None] | None = None,
             what: Callable[[], str] | None = None) -> None:
        if self._thread is None:  # a worker that never copies from a GPU never starts it
            self._thread = threading.Thread(target=self._wait, name="gp-host-copies", daemon=True)
            # it does GPU work and nothing else: it may keep numba's device and its torch
            # stream set (``kernels/cuda/streams.py``)
            self._thread.owns_gpu_work = True
            self._thread.start()
        self._queued.put((done, work, then, waited, what))

    def _wait(self) -> None:
        while (item := self._queued.get()) is not None:
            if self._closed:
                continue  # the job is over: what is still queued is dropped
            done, work, then, waited, what = item
            try:
                if work is None:
                    with _on_event_device(done):
                        done.synchronize()  # (without the GIL)
                    if waited is not None:
                        waited()
                else:
                    then = functools.partial(then, work())
            except Exception as e:  # noqa: BLE001 - the communication thread raises it
                then = _raiser(e, what) if work is None else functools.partial(_reraise, e)
            self._finished.append(then)
            self._wake()

    def run_finished(self) -> None:
        """On the communication thread: what follows every copy finished so far, in order."""
        while self._finished:
            self._finished.popleft()()

    def close(self, timeout_s: float) -> bool:
        """Stop the thread, dropping what is still queued (the job is over), and wait for it
        at most ``timeout_s``: whether it ended."""
        if self._thread is None:
            return True
        self._closed = True
        self._queued.put(None)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


def end_gpu_work(copies: HostCopies, registered: list, timeout_s: float) -> None:
    """At a worker's end, before it unmaps the host memory its GPU copies use: stop
    ``copies``' thread (an encoder may be running there), wait on the host for all that
    gradpress's CUDA streams hold, then give the driver back the registrations of
    ``registered`` (chunks), each on its device; at most ``timeout_s`` in all (a warning,
    and the memory stays registered, where it ran out). Whatever a CUDA error raises here (a
    sticky one fails every later call) is logged: the caller still closes the rest."""
    deadline = time.monotonic() + timeout_s
    try:
        stopped = copies.close(timeout_s)
        streams = sys.modules.get("gradpress.kernels.cuda.streams")  # (a worker that used a GPU)
        if not (stopped and (streams is None or streams.drain(max(0.0, deadline - time.monotonic())))):
            log.warning("the GPU's copies had not ended %g s after the job: its registered host memory is "
                        "unmapped under them", timeout_s)
            return
        for chunk in registered:
            chunk.pinned.release()
    except Exception:  # noqa: BLE001 - the worker's sockets and memory must still be closed
        log.exception("the worker's GPU work did not end cleanly")


def _reraise(error: Exception) -> None:
    raise error


def _raiser(error: Exception, what: Callable[[], str] | None) -> Callable[[], None]:
    def fail() -> None:  # a CUDA error, which a device keeps: the worker cannot go on
        of = f" ({what()})" if what is not None else ""
        raise RuntimeError(f"a copy from the GPU to the host failed{of}: {error!r}") from error
    return fail


def _on_event_device(event: Any):
    from ..kernels.cuda import streams
    return streams.on_event_device(event)


def _queried(event: Any) -> bool:
    """Whether ``event`` has happened, asked with its GPU current (``on_event_device``)."""
    with _on_event_device(event):
        return event.query()
