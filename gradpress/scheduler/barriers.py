"""Barriers: a node waits at (group, seq) until every member of the group arrived there.

The group is "all", "worker" or "server"; everyone in it hears BARRIER_DONE at once.
No sockets here: the scheduler sends what arrive() returns.
"""
from __future__ import annotations

from typing import Iterable

from ..net.protocol import Op
from .roster import Member

# Barriers a job may have open at once (a worker has one; the rest is a peer gone wrong).
MAX_OPEN_BARRIERS = 10_000
GROUPS = ("all", "worker", "server")


class Barriers:
    def __init__(self):
        self.open: dict[tuple[str, int], set[bytes]] = {}  # (group, seq) -> the identities arrived
        self.left: dict[bytes, str] = {}  # a worker that finished while others went on -> why no barrier completes

    def arrive(self, member: Member, group: str, seq: int,
               members: Iterable[Member]) -> list[tuple[list[bytes], Op, dict]]:
        """Record ``member`` at barrier (group, seq) of the job's ``members``; returns the messages to send."""
        if group not in GROUPS:
            # group and seq name the barrier, so that the waiting node fails it now, not at its timeout
            return [([member.identity], Op.ERROR,
                     {"message": f"unknown barrier group {group!r}", "group": group, "seq": seq})]
        if (group, seq) not in self.open and len(self.open) >= MAX_OPEN_BARRIERS:
            return [([member.identity], Op.ERROR, {"message": f"more than {MAX_OPEN_BARRIERS} barriers open "
                     f"at once; barrier {seq} of {group!r} refused", "group": group, "seq": seq})]
        gone = next((why for who, why in self.left.items() if group in ("all", "worker") and who != member.identity
                     and who not in self.open.get((group, seq), ())), "")
        if gone:
            return [([member.identity], Op.ERROR, {"message": gone, "group": group, "seq": seq})]
        arrived = self.open.setdefault((group, seq), set())
        arrived.add(member.identity)
        expected = [m.identity for m in members if group in ("all", m.role)]
        if not arrived.issuperset(expected):
            return []
        del self.open[(group, seq)]
        return [(expected, Op.BARRIER_DONE, {"group": group, "seq": seq})]

    def leave(self, member: Member, why: str) -> list[tuple[list[bytes], Op, dict]]:
        """``member`` (a worker) finished while others go on: the workers' barriers it has not
        reached fail now, naming it (``why``), and so does every later one."""
        self.left[member.identity] = why
        failed = [(group, seq) for (group, seq), arrived in self.open.items()
                  if group in ("all", "worker") and member.identity not in arrived]
        return [(sorted(self.open.pop(barrier)), Op.ERROR, {"message": why, "group": barrier[0], "seq": barrier[1]})
                for barrier in failed]
