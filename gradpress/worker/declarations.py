"""Tensors being declared to the job, on the worker's communication thread.

A tensor's first use declares it: the scheduler gives it its keys once every worker has
declared it alike. A push_pull of an undeclared tensor does not wait for that on the
caller's thread: its job rides with the declaration and starts when the keys come. Had
the caller waited, workers that first use tensors in different orders would each wait
for a name the other has not reached yet (a parameter used on one worker only in the
first step: the backward hooks of that worker declare it first, the others at the step's
flush) until GRADPRESS_OP_TIMEOUT_S. torch.distributed's DDP takes such parameters with
``find_unused_parameters=True``; Horovod negotiates by name, in any order.
"""
from __future__ import annotations

import time
from typing import Callable

from ..errors import OpTimeoutError, TensorMismatchError
from ..net.protocol import ProtocolError
from . import commands as cmd
from .deadlines import Deadline, Deadlines
from .future import Future
from .keys import KeyTable, Tensor


class Declarations:
    """The declarations under way: their waiters (each with the push_pull to start once
    the tensor is declared, if any), and one deadline per name."""

    def __init__(self, table: KeyTable, deadlines: Deadlines, timeout_s: float,
                 send: Callable[..., None], start: Callable[[cmd.StartPushPull], None]):
        self.table = table
        self._deadlines = deadlines
        self._timeout_s = timeout_s
        self._send = send          # a DECLARE to the scheduler
        self._start = start        # a push_pull whose tensor is declared
        self._waiting: dict[str, list[cmd.Declare]] = {}
        self._expiry: dict[str, Deadline] = {}

    def declare(self, c: cmd.Declare) -> None:
        known = self.table.tensors.get(c.name)
        if known is not None:  # declared since the caller looked
            self._answer(c, known)
            return
        waiters = self._waiting.setdefault(c.name, [])
        waiters.append(c)
        if len(waiters) == 1:
            extra = {"compression_params": c.spec.compression_params} if c.spec else {}
            try:
                self._send(name=c.name, count=c.count, dtype=c.dtype, parts=c.parts, **extra)
            except ProtocolError as e:  # a field the wire cannot carry: this declaration fails, not the thread
                self.declared(None, c.name, TensorMismatchError(f"tensor {c.name!r} cannot be declared: {e}"))
                return
            # the scheduler names the workers missing at its own deadline; this one is a backstop
            self._expiry[c.name] = self._deadlines.add(time.monotonic() + self._timeout_s + 2,
                                                       lambda name=c.name: self._expired(name))

    def declared(self, t: Tensor | None, name: str, error: Exception | None = None) -> None:
        """The scheduler declared ``t`` (``name``), or refused it with ``error``."""
        entry = self._expiry.pop(name, None)
        if entry is not None:
            self._deadlines.cancel(entry)
        for c in self._waiting.pop(name, []):
            if error is not None:
                self._fail(c, error)
            else:
                self._answer(c, t)

    def first(self, name: str) -> cmd.Declare | None:
        """The first waiter of ``name``: what the tensor was declared with here."""
        waiters = self._waiting.get(name)
        return waiters[0] if waiters else None

    def parked(self, names: list[str]) -> list[str]:
        """Those of ``names`` with a push_pull waiting for the tensor's declaration."""
        return [n for n in names if any(c.start is not None for c in self._waiting.get(n, ()))]

    def futures(self) -> list[Future]:
        """Every future that waits on a declaration (to fail them all on a fatal error)."""
        return [f for cs in self._waiting.values() for c in cs
                for f in ([c.future] + ([c.start.job.future] if c.start is not None else []))]

    def _answer(self, c: cmd.Declare, t: Tensor) -> None:
        try:
            t.check_alike(c.count, c.dtype, c.spec, c.layout)
        except TensorMismatchError as e:
            self._fail(c, e)
            return
        c.future.set(t)
        if c.start is not None:
            c.start.job.tensor = t
            self._start(c.start)

    @staticmethod
    def _fail(c: cmd.Declare, error: Exception) -> None:
        c.future.fail(error)
        if c.start is not None:
            c.start.job.future.fail(error)

    def _expired(self, name: str) -> None:
        self._expiry.pop(name, None)
        for c in self._waiting.pop(name, []):
            self._fail(c, OpTimeoutError(f"declare tensor {name!r}: no answer within {self._timeout_s:g} s "
                                         f"(GRADPRESS_OP_TIMEOUT_S)"))
