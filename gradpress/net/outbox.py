"""Sending on a ROUTER socket without ever blocking, whatever a peer does.

A ROUTER with ROUTER_MANDATORY blocks a send to a peer whose queue is full (its
high-water mark reached: the peer does not read). One such peer would stop the
scheduler's or a server's only I/O thread, and with it every heartbeat. Here every
send is non-blocking (``zmq.NOBLOCK``); a message that does not fit waits in that
peer's own backlog, in order, and is retried on every pass of the owner's loop
(:meth:`Outbox.flush`). A peer that takes nothing for ``stall_s`` seconds, or whose
backlog passes ``max_backlog`` messages, is cut off (its backlog dropped, its name
logged, its later messages ignored: see guard.py). The others never wait for it.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable, Sequence

import zmq

from .. import logs
from . import protocol
from .guard import PeerGuard
from .protocol import Op

log = logging.getLogger(__name__)

# Below this, copying is cheaper than ZeroMQ's zero-copy bookkeeping (as in transport.py).
_ZERO_COPY_MIN_BYTES = 65536
# How often the owner's loop should come back while some backlog waits.
RETRY_INTERVAL_S = 0.02


class Outbox:
    def __init__(self, sock: zmq.Socket, guard: PeerGuard, stall_s: float, max_backlog: int = 100_000,
                 names: Callable[[bytes], str] = lambda identity: "",
                 clock: Callable[[], float] = time.monotonic):
        self.sock, self.guard, self.stall_s, self.max_backlog = sock, guard, stall_s, max_backlog
        self.names, self.clock = names, clock
        self._backlog: dict[bytes, deque] = {}
        self._progress: dict[bytes, float] = {}  # identity -> when its backlog last moved
        self.sent = 0

    @property
    def pending(self) -> bool:
        """True while some peer's backlog waits (poll for at most RETRY_INTERVAL_S then)."""
        return bool(self._backlog)

    def send(self, identity: bytes, op: Op, sender: str, buffers: Sequence[Any] = (), **fields: Any) -> None:
        """Encode and send one message to ``identity`` (or queue it: never blocks)."""
        self.send_frames(identity, [protocol.encode(op, sender, **fields), *buffers])

    def send_frames(self, identity: bytes, frames: list) -> None:
        """Send an encoded message (header frame, then data frames) to ``identity``."""
        if self.guard.is_cut(identity):
            return
        queue = self._backlog.get(identity)
        if queue is not None:  # keep order: behind what already waits
            queue.append(frames)
            self._check(identity, queue)
            return
        if not self._try(identity, frames):
            self._backlog[identity] = deque([frames])
            self._progress[identity] = self.clock()

    def flush(self) -> None:
        """Retry every backlog; cut off the peers that took nothing for too long."""
        for identity in list(self._backlog):
            queue = self._backlog[identity]
            while queue and self._try(identity, queue[0]):
                queue.popleft()
                self._progress[identity] = self.clock()
            if not queue:
                del self._backlog[identity], self._progress[identity]
            else:
                self._check(identity, queue)

    def _check(self, identity: bytes, queue: deque) -> None:
        waited = self.clock() - self._progress[identity]
        if waited > self.stall_s or len(queue) > self.max_backlog:
            self.guard.cut(identity, f"it has not read its messages for {waited:.1f} s "
                                     f"({len(queue)} waiting for it, dropped)", self.names(identity))
            del self._backlog[identity], self._progress[identity]

    def _try(self, identity: bytes, frames: list) -> bool:
        """Send one message now; False if the peer's queue is full."""
        try:
            # ROUTER_MANDATORY checks the peer's queue at the identity frame: the rest follows
            self.sock.send(identity, zmq.SNDMORE | zmq.NOBLOCK)
        except zmq.Again:
            return False
        except zmq.ZMQError as e:  # EHOSTUNREACH: the peer is gone; nobody is left to tell
            log.debug("could not send to %s: %s", logs.peer(identity), e)
            return True
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            nbytes = getattr(frame, "nbytes", None) or len(frame)
            self.sock.send(frame, (zmq.SNDMORE if i < last else 0) | zmq.NOBLOCK,
                           copy=nbytes < _ZERO_COPY_MIN_BYTES)
        self.sent += 1
        return True
