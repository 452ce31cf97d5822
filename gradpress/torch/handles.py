"""Handles: what the asynchronous push_pulls return, and what ``synchronize`` waits on."""
from __future__ import annotations

import contextlib
import itertools
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from ..worker.future import Future

_handles: dict[int, "Pending"] = {}
_ids = itertools.count(1)
_issued = 0  # the latest handle
_failed: dict[int, BaseException] = {}  # handles whose wait raised, recent ones: a second wait raises again
_MOST_FAILED = 64  # (an error holds its traceback's frames)
# push_pulls whose wait ran out while they went on: undone (``abandon``) once they are over,
# so that a staging buffer they hold is not kept busy for good
_orphans: list["Pending"] = []


def on_raised(error: BaseException) -> None:
    """Told of every error a wait raised to the program (replaced by failures.note_raised_on:
    the exit status)."""


@dataclass
class Pending:
    future: Future
    output: torch.Tensor
    finish: Callable[[], None] | None  # lands the result in output (a staging copy back, a sparse union)
    # what a failed push_pull leaves to undo once it is over: the consumer's stream waits for
    # the worker's GPU work on the tensors, a staging buffer is given back
    abandon: Callable[[], None] | None = None

    def then(self, output: torch.Tensor, land: Callable[[], None] | None) -> None:
        """The push_pull's result is ``output`` (a tensor it travelled for), landed there by
        ``land`` after this one's own ``finish``."""
        before, self.output = self.finish, output
        if land is not None:
            self.finish = land if before is None else lambda: (before(), land())


def register(pending: Pending) -> int:
    global _issued
    handle = next(_ids)
    _issued = max(_issued, handle)
    _handles[handle] = pending
    return handle


def before_start() -> None:
    """Undo the push_pulls whose wait ran out and which are over since (``_orphans``), before
    a new one starts: their staging buffers free for it, and a failed GPU one's wait on the
    device not queued behind the new one's work."""
    if _orphans:
        _undo_orphans()


def lookup(handle: int) -> Pending:
    try:
        return _handles[handle]
    except KeyError:
        raise ValueError(f"unknown push_pull handle {handle} (already synchronized?)") from None


def wait(handle: int, timeout_s: float) -> torch.Tensor | None:
    """Wait up to ``timeout_s`` for the push_pull behind ``handle``; its output tensor. A
    handle waited for already gives None, as BytePS's ``synchronize`` does, unless that
    wait raised: then it raises the same error again (the push_pull may still write into its
    tensor). One never issued raises ValueError."""
    if handle in _failed:
        raise _failed[handle]
    if isinstance(handle, int) and 0 < handle <= _issued and handle not in _handles:
        return None
    pending = lookup(handle)
    try:
        try:
            pending.future.result(timeout_s)
        except BaseException as e:
            _failed[handle] = e
            on_raised(e)
            if len(_failed) > _MOST_FAILED:
                del _failed[next(iter(_failed))]
            # failed: the program may go on (an elastic restart) and free the tensors. Not
            # where only this wait ran out: the push_pull may still write into them (it is undone
            # once over, at a later start).
            if pending.abandon is not None:
                if pending.future.done():
                    pending.abandon()
                else:
                    _orphans.append(pending)
            raise
        if pending.finish is not None:
            pending.finish()
        return pending.output
    finally:
        _handles.pop(handle, None)


def _undo_orphans() -> None:
    for pending in [p for p in _orphans if p.future.done()]:
        with contextlib.suppress(ValueError):  # (taken by another thread meanwhile)
            _orphans.remove(pending)
            with contextlib.suppress(Exception):  # its error was the wait's to raise, and it did
                pending.abandon()


def settle(timeout_s: float) -> None:
    """Wait until every push_pull started through a handle is over (its result in, or
    failed), up to ``timeout_s`` in all; the handles stay for their ``synchronize``."""
    deadline = time.monotonic() + timeout_s
    for pending in list(_handles.values()):
        with contextlib.suppress(Exception):  # a failure is the synchronize's to raise
            pending.future.result(deadline - time.monotonic())


def wait_all(handles: list[int], wait: Callable[[int], Any]) -> list:
    """``wait`` for each of ``handles`` in turn, each one even after another failed, so that
    none is left pending and each failed one's clean-up runs (``abandon``: a CUDA
    consumer's stream waits for what gradpress's streams still write into its tensor); their
    outputs, or the first failure raised. Each push_pull has its own deadline: no longer
    than the slowest of them."""
    outputs, first = [], None
    for handle in handles:
        try:
            outputs.append(wait(handle))
        except Exception as e:  # noqa: BLE001 - the first is raised once every one is over
            first = first or e
    if first is not None:
        raise first
    return outputs


@contextlib.contextmanager
def all_waited(wait: Callable[[int], Any]) -> Iterator[list[int]]:
    """A list for the handles a block starts, each waited for (``wait_all``) when it ends,
    also when it raised, before its own error goes on (a start refused midway)."""
    started: list[int] = []
    try:
        yield started
    except Exception:
        with contextlib.suppress(Exception):
            wait_all(started, wait)
        raise
    wait_all(started, wait)
