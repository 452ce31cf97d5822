"""What one peer may cost a process: a message budget per peer, cut-offs, and drops logged once.

A process that listens (the scheduler, a server) keeps one :class:`PeerGuard` in the
thread that owns its ROUTER socket. Each peer (a ZeroMQ identity) has a token bucket
of ``burst`` messages refilled at ``rate_per_s``; a message that the owner charges
takes a token, and a peer with none left is cut off: from then on its messages are
dropped unread and nothing is sent to it. The scheduler charges every message (its
members send a few per second); a server charges only messages it has to refuse, so
a worker's legitimate push/pull rate is never limited. A peer that never reads its
replies is cut off too (by the outbox, net/outbox.py).

Drops are logged once per peer, with what was wrong; later drops from that peer are
counted and summed up in one line every ``REPORT_EVERY_S`` seconds, so a flood cannot
flood the log as well.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from .. import logs

log = logging.getLogger(__name__)

REPORT_EVERY_S = 10.0
# Peers remembered at most; beyond it, those with a full bucket (idle, harmless) are forgotten.
MAX_TRACKED_PEERS = 10_000
# What a drop's reason may take of a log line (callers quote what a peer sent with logs.peer).
MAX_WHY_CHARS = 400


class PeerGuard:
    def __init__(self, owner: str, rate_per_s: float, burst: float,
                 clock: Callable[[], float] = time.monotonic):
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(f"a peer's message budget needs a rate > 0 and a burst >= 1 "
                             f"(got {rate_per_s}, {burst})")
        self.owner, self.rate, self.burst, self.clock = owner, rate_per_s, burst, clock
        self._buckets: dict[bytes, tuple[float, float]] = {}  # identity -> (tokens, when)
        self._cut: dict[bytes, str] = {}                     # identity -> why
        self._dropped: dict[bytes, int] = {}                 # identity -> drops not yet reported
        self._names: dict[bytes, str] = {}                   # identity -> how a log line names it
        self._logged: set[bytes] = set()                     # peers whose first drop was logged
        self._last_report = clock()
        self.total_dropped = 0

    def is_cut(self, identity: bytes) -> bool:
        return identity in self._cut

    def charge(self, identity: bytes, name: str = "") -> bool:
        """Take one message from ``identity``'s budget. False: it is (now) cut off."""
        if identity in self._cut:
            self._count(identity)
            return False
        now = self.clock()
        tokens, when = self._buckets.get(identity, (self.burst, now))
        tokens = min(self.burst, tokens + (now - when) * self.rate) - 1
        if tokens < 0:
            self.cut(identity, f"it sent more than {self.burst:g} messages at over {self.rate:g} per second",
                     name)
            return False
        if identity not in self._buckets and len(self._buckets) >= MAX_TRACKED_PEERS:
            self._forget_idle(now)
        self._buckets[identity] = (tokens, now)
        return True

    def cut(self, identity: bytes, why: str, name: str = "") -> None:
        """Stop hearing and answering ``identity``, saying so once in the log."""
        if identity in self._cut:
            return
        self._cut[identity] = why
        self._buckets.pop(identity, None)
        self._names.setdefault(identity, name)
        log.warning("%s: cut off peer %s: %s; its messages are dropped from now on",
                    self.owner, self._describe(identity), why)

    def dropped(self, identity: bytes | None, why: str, name: str = "") -> None:
        """A message from ``identity`` was refused for ``why``: logged the first time, counted after."""
        key = identity or b""
        if key in self._logged or len(self._logged) >= MAX_TRACKED_PEERS:
            self._count(key)
            return
        self._logged.add(key)
        self._names.setdefault(key, name)
        self.total_dropped += 1
        log.warning("%s: %s (from %s); further drops from it are counted", self.owner,
                    why[:MAX_WHY_CHARS], self._describe(key))

    def report(self) -> None:
        """Every REPORT_EVERY_S seconds: one line per peer whose messages were dropped since."""
        now = self.clock()
        if now - self._last_report < REPORT_EVERY_S or not self._dropped:
            return
        for identity, n in self._dropped.items():
            log.warning("%s: dropped %d more message(s) from %s in the last %.0f s%s", self.owner, n,
                        self._describe(identity), now - self._last_report,
                        " (cut off)" if identity in self._cut else "")
        self._dropped.clear()
        self._last_report = now

    def _count(self, identity: bytes) -> None:
        self._dropped[identity] = self._dropped.get(identity, 0) + 1
        self.total_dropped += 1

    def _describe(self, identity: bytes) -> str:
        name = self._names.get(identity)
        return f"{logs.peer(name)} ({logs.peer(identity)})" if name else logs.peer(identity)

    def _forget_idle(self, now: float) -> None:
        for identity, (tokens, when) in list(self._buckets.items()):
            if tokens + (now - when) * self.rate >= self.burst:
                del self._buckets[identity]
