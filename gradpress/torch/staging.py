"""Host staging for tensors that cannot travel from their own memory (CUDA, non-contiguous,
bfloat16, integers), and the stream ordering of CUDA tensors handed to the worker.

A CUDA tensor is staged into a pinned host buffer kept per tensor name and reused every
call (as BytePS keeps one per tensor): the device-to-host copy runs asynchronously on torch's
current stream, and the communication thread waits for the event recorded after it before
it reads the buffer, so the training thread never blocks on the copy. (A fresh pageable
``tensor.to("cpu")`` every call cost 117.6 ms for 134 MB on an H200; a reused pinned
buffer 2.5 ms.) The average comes back with an asynchronous copy on the consumer's stream.

CUDA tensors that the worker's kernels compress in place run on the legacy default stream
(numba's launches, and torch's on the communication thread): ``after_producer`` makes it
wait for the gradient's producer, ``before_consumer`` makes the consumer's stream wait for it.
"""
from __future__ import annotations

import torch


class HostStaging:
    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}   # pinned, by tensor name
        self._busy: set[str] = set()

    def stage(self, name: str, tensor: torch.Tensor, wire: torch.dtype) -> tuple[torch.Tensor, object | None]:
        """``tensor`` flat in host memory as ``wire``; for a CUDA tensor also the event the
        reader must wait for (the asynchronous copy's end)."""
        if not tensor.is_cuda:
            return tensor.detach().to("cpu", wire, copy=True).contiguous().reshape(-1), None
        source = tensor.detach().reshape(-1)
        if source.dtype != wire:
            source = source.to(wire)  # widened on the device (bfloat16 -> float32, exactly)
        buffer = self._take(name, source.numel(), wire)
        buffer.copy_(source, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(tensor.device))
        return buffer, copied

    def _take(self, name: str, n: int, dtype: torch.dtype) -> torch.Tensor:
        if name in self._busy:  # the same name twice in flight: the second gets its own buffer
            return torch.empty(n, dtype=dtype, pin_memory=True)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() != n or buffer.dtype != dtype:
            buffer = self._buffers[name] = torch.empty(n, dtype=dtype, pin_memory=True)
        self._busy.add(name)
        return buffer

    def done(self, name: str, buffer: torch.Tensor) -> None:
        """``buffer`` (``stage``'s) may be reused: its average has been copied out."""
        if self._buffers.get(name) is buffer:
            self._busy.discard(name)


def after_producer(tensor: torch.Tensor) -> None:
    """Work queued on the legacy default stream from now on waits for what torch's current
    stream has queued so far (the gradient's producer): an event, no host wait."""
    current = torch.cuda.current_stream(tensor.device)
    default = torch.cuda.default_stream(tensor.device)
    if current != default:
        default.wait_stream(current)


def before_consumer(tensor: torch.Tensor) -> None:
    """The consumer's stream waits for what the communication thread queued on the legacy
    default stream (its copies and kernels into ``tensor``)."""
    current = torch.cuda.current_stream(tensor.device)
    default = torch.cuda.default_stream(tensor.device)
    if current != default:
        current.wait_stream(default)
