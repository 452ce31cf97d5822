"""Pulled payloads onto the GPU through pinned staging: the device decoders' uploads.

A pulled frame is pageable memory (ZeroMQ's). A copy from pageable memory goes through the
driver's own bounce buffers and returns only once they hold it: on the H200 the onebit
decoder's upload alone was 16% of the communication thread's samples (about 15 ms a step
for the transformer's 60 partitions), the thread's single largest line. Here the frame is
first copied on the host into a pinned buffer of this thread's (a memcpy at memory speed),
and the copy to the device from there is queued without waiting.

A staging buffer is written again only once the device has read it: an event recorded after
its copy is waited for first. Where the device has not yet read the buffer of a role and
size, the next of up to ``_TURNS`` buffers is taken: a tensor's partitions land back to back
where their servers' replies are read in one turn of the loop, and with one buffer each
upload waited on the host for the one before it, queued behind that partition's decode. One
upload at a time keeps to one buffer. The device array it lands in is scratch reused in
stream order, as before.
"""
import threading
from typing import Any

import numpy as np
from numba import config, cuda

from gradpress.kernels.cuda import device, scratch, streams

_MOST_STAGES = 64  # per thread (each at most a partition): a few roles and sizes; a job of many is not hoarded
_TURNS = 4  # buffers per role and size at most, the next taken while the device still reads one
_local = threading.local()


class _Stage:
    """A pinned host buffer and the event recorded after the last copy out of it (waiting
    for one never recorded returns at once)."""

    def __init__(self, nbytes: int) -> None:
        self.host = device.pinned_host(nbytes, np.uint8)
        # the simulator's events take no timing argument
        self.done = cuda.event() if config.ENABLE_CUDASIM else cuda.event(timing=False)


def _stage(nbytes: int, role: str) -> _Stage:
    """This thread's staging buffer for ``role`` on the current device and lane, of at least
    ``nbytes`` (a power of two: payloads of one partition vary in size from round to round)."""
    stages = _local.__dict__.setdefault("stages", {})
    turns = _local.__dict__.setdefault("turns", {})
    size = 1 << max(6, (nbytes - 1).bit_length())
    kind = (streams.current_index(), streams.current_lane(), role, size)
    turn = turns.get(kind, 0)
    stage = stages.get((*kind, turn))
    if stage is not None and not _read(stage):
        turn = (turn + 1) % _TURNS
    turns[kind] = turn
    key = (*kind, turn)
    stage = stages.get(key)
    if stage is None:
        if len(stages) >= _MOST_STAGES:
            _retire(stages)
        stage = stages[key] = _Stage(size)
    return stage


def _read(stage: _Stage) -> bool:
    """Whether the device has read what was staged in ``stage`` (the simulator's copies end
    before the call returns, and its events have no ``query``)."""
    query = getattr(stage.done, "query", None)
    return query is None or query()


def _retire(stages: dict) -> None:
    """Drop every stage, each once its last copy has finished (the memory must outlive it)."""
    for stage in stages.values():
        stage.done.synchronize()
    stages.clear()


def upload(host: np.ndarray, role: str) -> Any:
    """``host`` on the device, in ``role``'s reused scratch, its copy queued on gradpress's
    stream; ``host`` may be freed or rewritten as soon as this returns."""
    host = np.ascontiguousarray(host)
    on_device = scratch.device_array(host.shape, host.dtype, role)
    if host.nbytes == 0:
        return on_device
    stage = _stage(host.nbytes, role)
    stage.done.synchronize()  # the device has read the payload staged here _TURNS uploads ago
    staged = stage.host[:host.nbytes].view(host.dtype).reshape(host.shape)
    np.copyto(staged, host)
    s = device.stream()
    on_device.copy_to_device(staged, stream=s)
    stage.done.record(s)
    return on_device
