"""Liveness and the job's end: heartbeats, lost and failed nodes, and SHUTDOWN until acknowledged.

The scheduler exchanges heartbeats with every node and announces a node silent for
PS_HEARTBEAT_TIMEOUT to everyone (ending the job: there is no recovery yet). A worker
that fails (or its launcher) sends ABORT with its first error line: the others hear at
once which worker failed and why. Once every worker finished, the job ends in order:
SHUTDOWN is resent until every member acknowledged it, or PS_HEARTBEAT_TIMEOUT passed.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from .. import logs
from ..config import Settings
from ..net import transport
from ..net.protocol import MAX_REASON_CHARS, Op
from .roster import Member, Roster, reported

# The scheduler's logger, as before this part moved here: log readers and filters match on its name.
log = logging.getLogger(__package__ + ".scheduler")


class Liveness:
    """Mixed into the Scheduler, which provides these three."""

    s: Settings
    roster: Roster
    _send_each: Callable[..., None]  # (identities, op, **fields): send to each, skipping peers gone

    def _init_liveness(self) -> None:
        self._last_beat = 0.0
        self._started = time.monotonic()
        self.exit_code: int | None = None
        self._failure = ""          # why the job failed (answered to late registrations)
        self._linger_until = 0.0    # after a failure, keep answering until then
        self._unacked: set[bytes] = set()  # members yet to acknowledge the SHUTDOWN that ended the job
        self._end_reason = ""

    # ---- liveness -------------------------------------------------------

    def _purge(self) -> None:
        now = time.monotonic()
        if not self.roster.registered:
            if now - self._started > self.s.connect_timeout_s:
                missing = self.roster.missing_summary()
                log.error("not every node registered within GRADPRESS_CONNECT_TIMEOUT_S=%g s: %s",
                          self.s.connect_timeout_s, missing)
                self._end(1, f"registration timed out: {missing}")
            return
        for m in self.roster.members.values():
            silent = now - m.last_seen
            if not m.finished and silent > self.s.heartbeat_timeout_s:
                self._lost(m, f"no heartbeat for {silent:.1f} s "
                              f"(PS_HEARTBEAT_TIMEOUT={self.s.heartbeat_timeout_s:g})")
                return

    def _lost(self, m: Member, reason: str) -> None:
        log.error("lost %s (pid %d on %s): %s", m.name, m.pid, logs.peer(m.host), reason)
        reason = f"{reason}; it ran as pid {m.pid} on {logs.peer(m.host)}"  # (which pod or machine to look at)
        others = [o.identity for o in self.roster.members.values() if o is not m]
        self._send_each(others, Op.NODE_LOST, role=m.role, rank=m.rank, reason=reason)
        # and the node itself: one stopped (SIGSTOP, a frozen VM) reads it when it runs again,
        # instead of finding the scheduler gone and blaming it
        self._send_each([m.identity], Op.SHUTDOWN, reason=f"the job failed: the scheduler lost {m.name} (this "
                                                          f"node: it was stopped or starved?): {reason}")
        self.exit_code = 1

    def _send_heartbeats(self) -> None:
        now = time.monotonic()
        if now - self._last_beat < self.s.heartbeat_interval_s:
            return
        self._last_beat = now
        # finished workers too: they wait for SHUTDOWN and would otherwise think us dead
        self._send_each([m.identity for m in self.roster.members.values()], Op.HEARTBEAT)

    # ---- a failed worker ------------------------------------------------

    def _abort(self, identity: bytes, sender: Member | None, h: dict) -> None:
        """A worker failed, or a server (its engine): tell everyone else who and why, and end
        the job with an error."""
        if sender is not None and sender.role == "server":  # the workers hear why now, not at its silence
            failed, rank, role = sender, sender.rank, "server"
        elif h.get("role") == "server":  # its launcher saw it exit (killed, say): not at its silence either
            failed = reported(self.roster.servers(), h)
            rank, role = failed.rank if failed is not None else -1, "server"
        else:
            (failed, rank), role = self.roster.failed_worker(sender, h), "worker"
        if failed is None and sender is None and self.roster.registered:
            # a process the running job never had (refused: a second job started on this
            # port with this secret, say) names none of its members: its failure is not the job's
            log.warning("ignored an ABORT from %s, not in this job: %s", logs.peer(h["from"]),
                        logs.peer(h["reason"], MAX_REASON_CHARS))
            self._send_each([identity], Op.SHUTDOWN, reason="this job is running without that process, whose "
                                                            "failure does not end it")
            return
        name = transport.node_name(role, rank) if rank >= 0 else f"{role} (pid {h.get('pid', '?')})"
        reason = f"failed: {h['reason']}"
        log.error("%s failed: %s", name, logs.peer(h["reason"], MAX_REASON_CHARS))  # (the cause, whole)
        self._failure = f"the job failed: {name} {reason}"
        others = [m.identity for m in self.roster.members.values() if m is not failed and m.identity != identity]
        self._send_each(others, Op.NODE_LOST, role=role, rank=rank, reason=reason,
                        **({} if rank >= 0 else {"name": name}))  # (a rank of -1 names nobody)
        self._send_each([identity], Op.SHUTDOWN, reason=self._failure)  # the sender's acknowledgement
        if failed is not None and failed.identity != identity:
            self._send_each([failed.identity], Op.SHUTDOWN, reason=self._failure)
        self.exit_code = 1
        self._linger_until = time.monotonic() + self.s.heartbeat_timeout_s

    # ---- the end --------------------------------------------------------

    def _end(self, code: int, reason: str) -> None:
        identities = [m.identity for m in self.roster.members.values()]
        self._send_each(identities, Op.SHUTDOWN, reason=reason)
        self.exit_code = code
        log.info("job ended: %s", reason)
        # Stay up, answering and resending SHUTDOWN in place of heartbeats, until every member
        # acknowledged it: a scheduler that exits at once can lose what it sent last (its socket
        # closed under unsent data), and members that never heard SHUTDOWN report it lost.
        self._unacked = set(identities)
        self._end_reason = reason
        self._linger_until = time.monotonic() + self.s.heartbeat_timeout_s if self._unacked else 0.0

    def _acked(self, identity: bytes) -> None:
        if identity in self._unacked:
            self._unacked.discard(identity)
            if not self._unacked:
                log.info("every member acknowledged SHUTDOWN")
                self._linger_until = 0.0

    def _resend_shutdown(self) -> None:
        """SHUTDOWN again, once per heartbeat interval, to members that have not acknowledged it."""
        now = time.monotonic()
        if self._unacked and now - self._last_beat >= self.s.heartbeat_interval_s:
            self._last_beat = now
            self._send_each(list(self._unacked), Op.SHUTDOWN, reason=self._end_reason)

    def _unacked_warning(self) -> None:
        """At exit: name the members that never acknowledged SHUTDOWN."""
        if self._unacked:
            log.warning("exiting without the SHUTDOWN acknowledgement of %s within PS_HEARTBEAT_TIMEOUT=%g s",
                        ", ".join(sorted(self.roster.members[i].name for i in self._unacked)),
                        self.s.heartbeat_timeout_s)
