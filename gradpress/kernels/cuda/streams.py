"""gradpress's own CUDA streams on each device, and the events that order them against torch's.

Every launch and copy a worker makes on a GPU goes to one of two streams per device that
torch created (torch's streams are non-blocking: they never wait for what the training
queued on the legacy default stream), as BytePS keeps one for copies off the device and one
for copies onto it:

- the push lane: encoders and copies to the host. It is ordered after a gradient's producer
  by an event recorded on torch's current stream when the gradient is handed over
  (``produced``, waited for on the device by ``wait_for``), so it holds copies that wait for
  gradients the backward pass has not made yet.
- the landing lane (``working_on(x, landing=True)``): pulled results copied onto the device,
  decoded and averaged there. A landing never queues behind those waits: an upload from
  pageable memory, which the driver may stage only once its stream gets to it, would
  otherwise hold the communication thread until the backward pass had made every gradient
  queued before it. It needs no event of its own: a partition's reply comes after its push,
  and every push is sent only once the host has seen its copy or encoder finish, after the
  producer. A consumer's stream waits on the event recorded after the output's last landing
  (``finished``).

The host waits for a stream only where it reads what the device wrote.

A call's cost matters: a 102-tensor model's hooks call ``produced`` per gradient, and the
communication thread enters ``working_on`` a few times per partition. So a thread switches
numba's context only when its device changes (a driver call each time cost 2-4% of that
thread on an H100), events are reused (a new one makes a driver event at its first record),
and the threads owning the worker's GPU work (``owns_gpu_work``: the communication and
host-copies threads) keep numba's device and gradpress's torch stream current between calls.
"""
from __future__ import annotations

import collections
import contextlib
import sys
import threading
import time
from typing import Any

from numba import config, cuda

PUSH, LANDING = 0, 1
_pairs: dict[tuple[int, int], tuple[Any, Any]] = {}   # (device, lane) -> (numba stream, torch stream or None)
_lock = threading.Lock()
_local = threading.local()   # .stream, .lane: working_on's; .device: numba's; .torch_current: device -> stream
# torch events free for reuse, by (device, blocking) (an event is its first record's device's)
_events: collections.defaultdict = collections.defaultdict(collections.deque)


def _torch() -> Any:
    """torch where the process uses it with a GPU (a worker of torch tensors), else None."""
    torch = sys.modules.get("torch")
    if config.ENABLE_CUDASIM or torch is None or not torch.cuda.is_available():
        return None
    return torch


def _pair(index: int, lane: int = PUSH) -> tuple[Any, Any]:
    pair = _pairs.get((index, lane))
    if pair is None:
        with _lock:
            pair = _pairs.get((index, lane))
            if pair is None:
                torch = _torch()
                # numba's stream in GPU ``index``'s context, not the caller's (and the caller's
                # device back after: an owned thread may be inside another GPU's ``working_on``)
                same = config.ENABLE_CUDASIM or getattr(_local, "device", None) == index
                with contextlib.nullcontext() if same else _switched(index):
                    if torch is not None:
                        made = torch.cuda.Stream(device=index)
                        pair = (cuda.external_stream(made.cuda_stream), made)
                    else:
                        pair = (cuda.stream(), None)
                _pairs[(index, lane)] = pair
    return pair


def current_lane() -> int:
    """The lane the enclosing ``working_on`` named (PUSH outside one): reused device scratch
    is kept per lane, since the two streams run at once."""
    return getattr(_local, "lane", PUSH)


def _index_of(x: Any) -> int:
    """The device index of ``x``: a torch CUDA tensor's own (no driver call), a numba
    device array's (its memory's context); numba's current device for anything else; 0
    under the simulator."""
    if config.ENABLE_CUDASIM:
        return 0
    device = getattr(x, "device", None)
    if getattr(device, "type", None) == "cuda" and device.index is not None:
        return device.index
    owner = getattr(getattr(getattr(x, "gpu_data", None), "context", None), "device", None)
    if owner is not None:  # e.g. a residual read for a checkpoint on the training thread
        return owner.id
    current = getattr(_local, "device", None)
    return current if current is not None else cuda.get_current_device().id


def current_index() -> int:
    """The device numba launches on from this thread (``working_on``'s, without a driver
    call where a thread keeps it); 0 under the simulator."""
    if config.ENABLE_CUDASIM:
        return 0
    current = getattr(_local, "device", None)
    return current if current is not None else cuda.get_current_device().id


def stream() -> Any:
    """The numba stream to launch and copy on: gradpress's stream of the device that the
    enclosing ``working_on`` named (else of numba's current device)."""
    made = getattr(_local, "stream", None)
    if made is not None:
        return made
    return _pair(0 if config.ENABLE_CUDASIM else cuda.get_current_device().id)[0]


def torch_stream(x: Any) -> Any:
    """The torch view of gradpress's stream on ``x``'s device (None: no torch, or the simulator)."""
    return _pair(_index_of(x))[1] if _torch() is not None else None


def _owned() -> bool:
    """Whether the calling thread does the worker's GPU work and nothing else: ``working_on``
    may then leave numba's device and torch's current stream set on it."""
    return getattr(threading.current_thread(), "owns_gpu_work", False)


def on_device(index: int):
    """A context in which numba launches on GPU ``index``. A thread keeps the device it used
    last: the context is switched (a push and a pop) only when it changes, and an adopted
    thread stays on the new one."""
    if config.ENABLE_CUDASIM or getattr(_local, "device", None) == index:
        return contextlib.nullcontext()
    if _owned():
        if getattr(_local, "device", None) is not None:  # select_device pushes a context: pop this
            _pop_context()  # thread's last, or a model over two GPUs grows the stack at every switch
            _local.device = None  # (until the next one is in: a failed select leaves none claimed)
        cuda.select_device(index)
        _local.device = index
        return contextlib.nullcontext()
    return _switched(index)


def _pop_context() -> None:
    from numba.cuda.cudadrv.driver import driver
    driver.pop_active_context()


def on_event_device(event: Any):
    """A context for a host wait on (or query of) torch's ``event`` with its GPU current on
    this thread: on a thread that never selected one, CUDA's runtime would make and use a
    context on GPU 0 for it (half a GiB there, for every worker of a machine)."""
    index = getattr(getattr(event, "device", None), "index", None)
    return on_device(index) if index is not None else contextlib.nullcontext()


@contextlib.contextmanager
def _switched(index: int):
    before = getattr(_local, "device", None)
    torch = _torch()
    # torch's device is set first and numba's context pushed inside it. Leaving a torch
    # stream block inside sets torch's stream back on the device torch believes current, and
    # selecting a device replaces the top of the thread's context stack: were that another
    # GPU (a thread that placed its model with .to("cuda:1") and never set the device), numba's
    # pop would find that GPU's context on top and fail, with a context left on the other GPU
    with (torch.cuda.device(index) if torch is not None else contextlib.nullcontext()), cuda.gpus[index]:
        _local.device = index
        try:
            yield
        finally:
            _local.device = before


@contextlib.contextmanager
def working_on(x: Any, landing: bool = False):
    """Launches, copies and torch ops on ``x`` (a CUDA tensor or device array) run on its
    GPU, on gradpress's push stream there, or its landing stream where ``landing``."""
    index = _index_of(x)
    lane = LANDING if landing else PUSH
    device_before = getattr(_local, "device", None)
    with on_device(index):
        made, torch_made = _pair(index, lane)
        before = getattr(_local, "stream", None), getattr(_local, "lane", PUSH)
        _local.stream, _local.lane = made, lane
        try:
            if torch_made is None:
                yield
            elif _owned():
                current = _local.__dict__.setdefault("torch_current", {})
                outer = current.get(index)
                if outer is not torch_made:  # only this thread changes it
                    _torch().cuda.set_stream(torch_made)
                    current[index] = torch_made
                try:
                    yield
                finally:
                    if before[0] is not None and outer is not None and outer is not torch_made:
                        _torch().cuda.set_stream(outer)  # nested in the other lane's block: its stream again
                        current[index] = outer
            else:
                with _torch().cuda.stream(torch_made):
                    yield
        finally:
            _local.stream, _local.lane = before
            if before[0] is not None and device_before not in (None, index) and _owned():
                _back_to(device_before)  # nested in another GPU's block: that GPU again


def _back_to(index: int) -> None:
    """An owning thread's numba device and torch stream (and torch's device with it) are
    those of GPU ``index`` again."""
    on_device(index)
    back = getattr(_local, "torch_current", {}).get(index)
    if back is not None:
        _torch().cuda.set_stream(back)


def event(index: int, blocking: bool = False) -> Any:
    """A torch event to record on device ``index`` (reused: ``recycle`` hands one back); a
    blocking one where a host thread will wait for it: it sleeps rather than spins a core."""
    try:
        return _events[index, blocking].popleft()
    except IndexError:
        return _torch().cuda.Event(blocking=blocking)


def recycle(done: Any, index: int, blocking: bool = False) -> None:
    """``done`` (``event(index, blocking)``'s), recorded on device ``index``, may be recorded
    again: every wait on it has been queued (a stream's ``wait_event`` takes the event's state
    when it is called) or has returned on the host."""
    if len(_events[index, blocking]) < 4096:
        _events[index, blocking].append(done)


def produced(x: Any) -> Any:
    """An event recorded on torch's current stream on ``x``'s device: what gradpress's stream
    waits for before it reads ``x`` (``wait_for``). No host wait."""
    made = event(x.device.index)
    made.record(_torch().cuda.current_stream(x.device))
    return made


def wait_for(ready: Any, x: Any) -> None:
    """gradpress's stream on ``x``'s device waits (on the device, not the host) for
    ``ready``: an event recorded on the producer's stream. The event is reused after."""
    made = torch_stream(x)
    if made is not None and ready is not None:
        made.wait_event(ready)
        recycle(ready, _index_of(x))


def settle(x: Any, consumer: Any) -> None:
    """``consumer`` (a torch stream on ``x``'s device) waits on the device for all that
    both of gradpress's streams there hold so far."""
    if _torch() is None:
        return
    index = _index_of(x)
    for lane in (PUSH, LANDING):
        made = _pairs.get((index, lane))
        if made is not None:
            consumer.wait_stream(made[1])


def finished(x: Any) -> Any:
    """An event recorded on the landing stream of ``x``'s device after every landing queued
    so far (a consumer's stream waits on it, then ``recycle``s it); None where there is no
    torch stream."""
    if _torch() is None:
        return None
    index = _index_of(x)
    done = event(index)
    done.record(_pair(index, LANDING)[1])
    return done


def drain(timeout_s: float) -> bool:
    """Wait on the host, at most ``timeout_s``, for all that gradpress's streams hold: before
    the worker unmaps the host memory it registered with the driver, which their copies may
    still read or write (a consumer waited for the last landing on the device, not the host).
    Whether they ended in time."""
    torch = _torch()
    if torch is None:
        return True
    marks = []
    for _, made in list(_pairs.values()):
        mark = torch.cuda.Event()
        mark.record(made)
        marks.append(mark)
    deadline = time.monotonic() + timeout_s
    # each queried with its GPU current (on a thread without one, CUDA would make a context on GPU 0)
    while not all(_done(mark) for mark in marks):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def _done(mark: Any) -> bool:
    with on_event_device(mark):
        return mark.query()
