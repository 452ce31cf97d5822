"""Host staging for tensors that cannot travel from their own memory (CUDA, non-contiguous,
bfloat16, integers), and the stream ordering of CUDA tensors handed to the worker.

A CUDA tensor is staged into a pinned host buffer kept per tensor name and reused every
call (as BytePS keeps one per tensor): the device-to-host copy runs asynchronously on torch's
current stream, and the communication thread waits for the event recorded after it before
it reads the buffer, so the training thread never blocks on the copy. (A fresh pageable
``tensor.to("cpu")`` every call cost 117.6 ms for 134 MB on an H200; a reused pinned
buffer 2.5 ms.) The average comes back with an asynchronous copy on the consumer's stream.

CUDA tensors that the worker's kernels compress, or copy by DMA, in place are worked on by
gradpress's own non-blocking stream on their device (numba's launches and copies, and torch's
ops on the communication thread; kernels/cuda/device.py): ``produced`` records the event it
waits for before it reads the gradient, ``before_consumer`` makes the consumer's stream wait
for the event recorded after the output's last copy or kernel.
"""
from __future__ import annotations

from typing import Callable

import torch

from . import exact_ints

NONAME = "push_pull.noname."  # the names of unnamed push_pulls, one a call


class HostStaging:
    """Args:
        declared: whether a name is a declared tensor of the job in force. Buffers of names
            that are not (an old plan's released groups, a job left) are dropped whenever a
            new buffer is made, so pinned memory follows the tensors in use; unnamed
            push_pulls (``push_pull.noname.N``, a name a call) get buffers of their own.
    """

    def __init__(self, declared: Callable[[str], bool] = lambda name: True):
        self._declared = declared
        self._buffers: dict[str, torch.Tensor] = {}   # pinned, by tensor name
        self._busy: set[str] = set()
        # by name: the event after the last copy out of its buffer onto a GPU (a non-blocking
        # copy reads the pinned buffer later, on the consumer's stream), and that GPU; the
        # next copy into it, perhaps on another stream or GPU, waits for it on the device
        self._read: dict[str, tuple[torch.cuda.Event, int]] = {}
        # by name: the event after the copy into its buffer, given back to the pool once the
        # average is out (every partition has been sent: nothing waits on it any more)
        self._copied: dict[str, tuple[torch.cuda.Event, int]] = {}

    def stage(self, name: str, tensor: torch.Tensor, wire: torch.dtype) -> tuple[torch.Tensor, object | None]:
        """``tensor`` flat in host memory as ``wire``; for a CUDA tensor also the event the
        reader must wait for (the asynchronous copy's end). 64-bit integers as their two
        halves (``exact_ints``; copied synchronously)."""
        if tensor.dtype in exact_ints.SPLIT:
            return exact_ints.split(tensor), None
        if not tensor.is_cuda:
            return tensor.detach().to("cpu", wire, copy=True).contiguous().reshape(-1), None
        source = tensor.detach().reshape(-1)
        if source.dtype != wire:
            source = source.to(wire)  # widened on the device (bfloat16 -> float32, exactly)
        from ..kernels.cuda import streams
        index = tensor.device.index
        buffer = self._take(name, source.numel(), wire)
        try:
            read = self._read.pop(name, None) if buffer is self._buffers.get(name) else None
            if read is not None:
                torch.cuda.current_stream(tensor.device).wait_event(read[0])
                streams.recycle(*read)
            buffer.copy_(source, non_blocking=True)
            # reused (a fresh one is a driver event made and destroyed a call); blocking: the
            # host-copies thread waits for it, asleep rather than spinning a core
            copied = streams.event(index, blocking=True)
            copied.record(torch.cuda.current_stream(tensor.device))
        except BaseException:
            self.failed(name, buffer)
            raise
        if buffer is self._buffers.get(name):
            self._copied[name] = (copied, index)
        return buffer, copied

    @staticmethod
    def summed(buffer: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """The sum that ``stage``'s ``buffer`` came back holding, as ``output``'s shape
        (64-bit integers put back together from their halves)."""
        if output.dtype in exact_ints.SPLIT:
            return exact_ints.join(buffer, output.dtype).view(output.shape)
        return buffer.view(output.shape)

    def _take(self, name: str, n: int, dtype: torch.dtype) -> torch.Tensor:
        if name in self._busy or name.startswith(NONAME):
            # the same name twice in flight: the second gets its own buffer
            return torch.empty(n, dtype=dtype, pin_memory=True)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() != n or buffer.dtype != dtype:
            self._drop_unused(name)
            buffer = self._buffers[name] = torch.empty(n, dtype=dtype, pin_memory=True)
        self._busy.add(name)
        return buffer

    def _drop_unused(self, taking: str) -> None:
        """Forget the buffers of names no longer declared (torch's pinned allocator keeps a
        freed buffer from reuse until the copies queued on it are done)."""
        for name in list(self._buffers):  # (a copy: another thread may drop a failed one meanwhile)
            if name != taking and name not in self._busy and not self._declared(name):
                self._forget(name)

    def _forget(self, name: str) -> None:
        from ..kernels.cuda import streams
        if self._buffers.pop(name, None) is None:
            return
        read = self._read.pop(name, None)
        if read is not None:  # nothing will wait for it
            streams.recycle(*read)
        copied = self._copied.pop(name, None)
        if copied is not None:
            streams.recycle(*copied, blocking=True)

    def done(self, name: str, buffer: torch.Tensor, read_on: torch.device | None = None) -> None:
        """``buffer`` (``stage``'s) may be reused: its average has been copied out (onto GPU
        ``read_on`` by a copy queued on its current stream, which the next copy in waits for)."""
        if self._buffers.get(name) is buffer:
            from ..kernels.cuda import streams
            if name in self._copied:
                streams.recycle(*self._copied.pop(name), blocking=True)
            if read_on is not None and read_on.type == "cuda":
                read = streams.event(read_on.index)
                read.record(torch.cuda.current_stream(read_on))
                self._read[name] = (read, read_on.index)
            self._busy.discard(name)

    def failed(self, name: str, buffer: torch.Tensor) -> None:
        """``buffer``'s push_pull failed: the next call of ``name`` gets a new one. Why not reuse
        it: the failed job's other partitions may still be sent, read from it (the job keeps
        its memory alive), and a copy of the next gradient into it would go out in their rounds."""
        if self._buffers.get(name) is buffer:
            del self._buffers[name]
            self._read.pop(name, None)
            self._copied.pop(name, None)   # (the job's partitions still queued may wait on it)
            self._busy.discard(name)


def produced(tensor: torch.Tensor) -> torch.cuda.Event:
    """An event recorded on torch's current stream when ``tensor`` is handed over: the
    worker's own stream waits for it on the device before it reads the gradient (the
    training thread never waits). The tensor and its output stay referenced by the job
    until the consumer's stream has waited for the worker's last copy into the output
    (``before_consumer``), so torch's allocator cannot hand their memory out early; no
    ``record_stream`` per call is needed (it and a fresh event cost half the hooks' time)."""
    from ..kernels.cuda import streams
    return streams.produced(tensor)


def before_consumer(tensor: torch.Tensor, done: torch.cuda.Event | None) -> None:
    """The consumer's stream (torch's current one, at ``synchronize``) waits on the device
    for ``done``: the event the worker recorded after its last copy or kernel into
    ``tensor``. No host wait, and nothing else queued on the worker's stream is waited for."""
    if done is not None:
        from ..kernels.cuda import streams
        torch.cuda.current_stream(tensor.device).wait_event(done)
        streams.recycle(done, tensor.device.index)


def after_failure(tensor: torch.Tensor, *held: torch.Tensor) -> None:
    """A failed push_pull of a CUDA tensor: the consumer's stream waits on the device for
    everything gradpress's streams there hold so far (its copies, kernels and landings), so
    that memory the program frees after catching the error is not handed out while they
    still read or write it (``held``: tensors kept alive until this call, like ``tensor``). A
    job's failure records no event after its last landing."""
    from ..kernels.cuda import streams
    streams.settle(tensor, torch.cuda.current_stream(tensor.device))
