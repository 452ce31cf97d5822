"""Asynchronous training (``BYTEPS_ENABLE_ASYNC=1``), as in BytePS: the servers hold the
parameters, initialised from rank 0's; each worker steps locally, pushes the change its
step made to each parameter and pulls the servers' current parameters."""
from __future__ import annotations

from typing import Callable

import torch

from ..torch.handles import wait_all
from .comm import OPS, Comm
from .table import ParameterTable


class AsyncParameters:
    """The parameters of ``table`` kept on the servers (names ``AsyncParam.<name>``)."""

    def __init__(self, table: ParameterTable, comm: Comm = OPS):
        self.table, self.comm = table, comm
        root = comm.rank() == 0
        with torch.no_grad():  # round 0 of every key: the servers' store becomes rank 0's values
            if not root:
                for p in table.trainable:
                    p.zero_()
            self._exchange()

    def adopt(self, p: torch.Tensor, name: str) -> None:
        """``p`` became trainable (``ParameterTable.adopt``): its key's round 0 makes the
        servers' copy rank 0's, as the constructor does for the others."""
        self.table.adopt(p, name)
        with torch.no_grad():
            if self.comm.rank() != 0:
                p.zero_()
            self.comm.wait(self._start(p))

    def step(self, local_step: Callable[[], object]):
        """Run ``local_step`` (the wrapped optimizer's), push each parameter's change, pull
        the servers' parameters into it."""
        before = [p.detach().clone() for p in self.table.trainable]
        loss = local_step()
        with torch.no_grad():
            for p, old in zip(self.table.trainable, before):
                p.sub_(old)  # the delta travels in the parameter's own memory and is replaced by the pull
            self._exchange()
        return loss

    def _exchange(self) -> None:
        wait_all([self._start(p) for p in self.table.trainable], self.comm.wait)

    def _start(self, p: torch.Tensor) -> int:
        return self.comm.start(p.data, "AsyncParam." + self.table.names[id(p)], average=False,
                               priority=self.table.priority[id(p)])
