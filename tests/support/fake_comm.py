"""A stand-in for the job's push_pulls, for testing routes alone (``gradpress.pipeline.Comm``).

It plays one worker of ``size``: every other worker pushes a tensor of its own, drawn from a
generator seeded by (the tensor's name, the round), so a numpy replay can add the same
values. It records what each push_pull was given (a clone, its device, spec, lr, priority)."""
from __future__ import annotations

import contextlib
import zlib
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Sent:
    name: str
    tensor: torch.Tensor
    device: torch.device
    spec: object
    lr: float | None
    priority: int
    average: bool


class FakeComm:
    def __init__(self, size: int = 2, rank: int = 0):
        self._size, self._rank = size, rank
        self.sent: list[Sent] = []
        self.rounds: dict[str, int] = {}
        self._out: dict[int, torch.Tensor] = {}

    def peers(self, name: str, round_: int, n: int) -> np.ndarray:
        """The sum of the other workers' pushes of ``name`` in round ``round_`` (float64)."""
        gen = np.random.default_rng(zlib.crc32(f"{name}/{round_}".encode()))
        return sum((gen.standard_normal(n) for _ in range(self._size - 1)), np.zeros(n))

    def start(self, tensor, name, *, priority=0, spec=None, lr=None, average=True):
        self.sent.append(Sent(name, tensor.detach().clone(), tensor.device, spec, lr, priority, average))
        round_ = self.rounds.get(name, 0)
        self.rounds[name] = round_ + 1
        if tensor.device.type != "meta" and not tensor.is_sparse:  # (a sparse tensor comes back as it went)
            flat = tensor.detach().reshape(-1)
            total = flat.numpy().astype(np.float64) + self.peers(name, round_, flat.numel())
            flat.copy_(torch.from_numpy((total / self._size if average else total).astype(flat.numpy().dtype)))
        handle = len(self.sent)
        self._out[handle] = tensor
        return handle

    def start_rows(self, tensor, name, *, priority=0):
        return self.start(tensor, name, priority=priority)

    def wait(self, handle, timeout_s=None):
        return self._out.pop(handle)

    def size(self):
        return self._size

    def rank(self):
        return self._rank

    def span(self, name, **args):
        return contextlib.nullcontext()

    @property
    def settings(self):
        from gradpress.config import Settings
        return Settings()
