"""Asynchronous training (``BYTEPS_ENABLE_ASYNC=1``), as in BytePS: the servers hold the
parameters, initialised from rank 0's; each worker steps locally, pushes the change its
step made to each parameter and pulls the servers' current parameters."""
from __future__ import annotations

from typing import Callable

import torch

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
        handles = [self.comm.start(p.data, "AsyncParam." + self.table.names[id(p)], average=False,
                                   priority=self.table.priority[id(p)]) for p in self.table.trainable]
        for h in handles:
            self.comm.wait(h)
