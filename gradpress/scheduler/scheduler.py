"""The scheduler: one ROUTER socket, one poll loop.

It waits for every worker and server to register, assigns ranks and sends the
address book; then it serves barriers and tensor declarations, exchanges
heartbeats with every node, announces a lost node to everyone (and ends the job:
there is no recovery yet), and ends the job in order once every worker finished: it exits once every member
acknowledged SHUTDOWN (or PS_HEARTBEAT_TIMEOUT passed, naming who did not).
A worker that fails (or its launcher) sends ABORT with its first error line: the
others hear at once which worker failed and why, instead of at a heartbeat timeout.

This module is the socket and the loop that dispatches each message; the roster
(registration, ranks, address book), barriers, declarations and liveness (heartbeats,
failures, the ordered end) are in their own modules.
"""
from __future__ import annotations

import logging
import os
import time

import zmq

from .. import logs
from ..net import transport
from ..net.guard import PeerGuard
from ..net.limits import Limits
from ..net.outbox import RETRY_INTERVAL_S, Outbox
from ..config import Settings
from ..errors import Terminated
from ..health import HealthFile
from ..placement import KeyPlacement
from ..net.protocol import Op
from .barriers import Barriers
from .declarations import Declarations
from .liveness import Liveness
from .roster import Member, Roster

log = logging.getLogger(__name__)
NAME = "scheduler 0"
# Messages taken per pass of the loop: heartbeats and the purge run whatever the inflow.
MAX_BATCH = 256


class Scheduler(Liveness):
    def __init__(self, settings: Settings, ctx: zmq.Context | None = None):
        self.s = settings
        self.ctx = ctx or transport.context(settings)
        self.sock, self.port = transport.router(self.ctx, settings, settings.root_port)
        # every message counts against its sender's budget: members send a few per second
        self.guard = PeerGuard("scheduler", settings.peer_rate, settings.peer_burst)
        self.outbox = Outbox(self.sock, self.guard, stall_s=settings.heartbeat_timeout_s, names=self._name_of)
        self.limits = Limits(settings.partition_bytes)
        self.roster = Roster(settings.num_worker, settings.num_server, settings.enable_async)
        self.barriers = Barriers()
        self.declarations: Declarations | None = None  # from the job's start: ranks and servers are known then
        self._init_liveness()
        if settings.port_file:
            tmp = settings.port_file + ".tmp"
            with open(tmp, "w") as fh:
                fh.write(str(self.port))
            os.replace(tmp, settings.port_file)
        log.info("scheduler listening on port %d", self.port)
        # For probes: ready once listening (nodes can register), alive while the loop turns.
        self.health = HealthFile(settings.health_file, settings.heartbeat_interval_s)
        self.health.ready(f"{NAME} listening on port {self.port}")

    # ---- the loop -------------------------------------------------------

    def run(self) -> int:
        """Serve until the job ends. Returns the process exit code."""
        try:
            while self.exit_code is None or time.monotonic() < self._linger_until:
                wait_s = RETRY_INTERVAL_S if self.outbox.pending else self.s.heartbeat_interval_s / 2
                if self.sock.poll(wait_s * 1000):
                    self._drain()
                # every pass, whatever the inflow: _drain takes at most MAX_BATCH messages
                self.outbox.flush()
                self.guard.report()
                if self.exit_code is not None:
                    self._resend_shutdown()
                    continue  # the job ended: only late arrivals and acknowledgements are answered now
                self._purge()
                self._send_heartbeats()
                self.health.beat()
                if self.declarations is not None:
                    for identities, kwargs in self.declarations.expire(time.monotonic()):
                        self._send_each(identities, Op.ERROR, **kwargs)
        finally:
            self._unacked_warning()
            self.sock.close()
        return self.exit_code

    def _drain(self) -> None:
        for _ in range(MAX_BATCH):
            if not self.sock.poll(0):
                return
            identity, header, _ = transport.recv(self.sock, routed=True, guard=self.guard)
            if header is None or not self.guard.charge(identity, self._name_of(identity)):
                continue
            member = self.roster.members.get(identity)
            if member is not None:
                member.last_seen = time.monotonic()
            try:
                self._dispatch(identity, member, header)
            except zmq.ZMQError as e:  # a peer vanished between its message and our reply
                log.warning("could not answer %s: %s", logs.peer(header["from"]), e)
            except Terminated:
                raise
            except Exception:  # a message no check foresaw: the job's only scheduler must not die of it
                log.exception("dropped a %s from %s that failed here", header["op"].name, logs.peer(header["from"]))

    def _dispatch(self, identity: bytes, member: Member | None, h: dict) -> None:
        op = h["op"]
        if self.exit_code is not None:  # the job is over: late arrivals learn why instead of waiting
            if op == Op.REGISTER:
                self._refuse(identity, h, self._failure or "the job already ended (a resumed job needs a "
                                                           "scheduler of its own)")
            elif op == Op.ABORT:  # a second report (the launcher's, after the worker's own): acknowledge it
                self._send_each([identity], Op.SHUTDOWN, reason=self._failure or "the job already ended")
            elif op == Op.SHUTDOWN_ACK:
                self._acked(identity)
        elif op == Op.REGISTER:
            self._register(identity, h)
        elif op == Op.ABORT:  # also from a launcher, or from a worker that failed before registering
            self._abort(identity, member, h)
        elif op == Op.HEARTBEAT and member is not None:
            pass  # liveness was refreshed on receipt
        elif member is None or not self.roster.registered:
            self.guard.dropped(identity, f"dropped {op.name} from an unregistered peer", logs.peer(h["from"]))
        elif op == Op.BARRIER:
            self._send_all(self.barriers.arrive(member, h["group"], h["seq"], self.roster.members.values()))
        elif op == Op.DECLARE and member.role == "worker" and self._too_big(identity, h):
            pass
        elif op == Op.DECLARE and member.role == "worker":
            messages = self.declarations.declare(identity, member.rank, h["name"], h["count"], h["dtype"],
                                                 h["parts"], time.monotonic(), h.get("compression_params"))
            servers = {m.rank: m.identity for m in self.roster.servers()}
            for _, reply, fields in list(messages):  # the servers learn what the job declared for them
                if reply == Op.DECLARED and "part_bytes" in fields:
                    messages.append(([servers[s] for s in sorted(set(fields["servers"])) if s in servers], reply,
                                     fields))
            self._send_all(messages)
        elif op == Op.FINISH and member.role == "worker":
            self._finished(member, h.get("busy", False))
        elif op == Op.ERROR:
            log.error("%s reports: %s", member.name, logs.peer(h["message"]))
        else:
            self.guard.dropped(identity, f"dropped unexpected {op.name}", member.name)

    def _too_big(self, identity: bytes, h: dict) -> bool:
        """A DECLARE whose partitions do not fit the partition size: refused, naming the tensor."""
        try:
            for part in h["parts"]:
                if isinstance(part, int):  # the rest of the list is Declarations' to check
                    self.limits.check_count(part, h["dtype"], f"tensor {logs.peer(h['name'])}")
        except ValueError as e:
            self._send_each([identity], Op.ERROR, name=h["name"], message=str(e))
            return True
        return False

    def _finished(self, member: Member, busy: bool) -> None:
        member.finished = True
        log.info("%s finished%s", member.name, " with push_pulls of its own still under way" if busy else "")
        if all(m.finished for m in self.roster.workers()):
            self._end(0, "done")
        elif not self.s.enable_async and not busy:
            # its rounds all completed before it finished: a round it has not pushed, a barrier it
            # has not reached, a tensor it has not declared never will be, and those waiting for
            # one hear why now, not at their deadline (reading server state goes on)
            why = (f"{member.name} finished (shutdown, or its script ended) while other workers go on: the "
                   f"workers ran different numbers of steps or push_pulls, so this can never complete")
            self._send_all(self.barriers.leave(member, why) + self.declarations.leave(member.rank, why))
            self._send_each([m.identity for m in self.roster.servers()], Op.LEFT, rank=member.rank, reason=why)
            # and the workers: its own machine's wait on it too where they sum locally (relay.py)
            self._send_each([m.identity for m in self.roster.workers() if not m.finished], Op.LEFT,
                            rank=member.rank, reason=why)

    def _name_of(self, identity: bytes) -> str:
        member = self.roster.members.get(identity)
        return member.name if member is not None else ""

    # ---- registration and the job's start --------------------------------

    def _register(self, identity: bytes, h: dict) -> None:
        why = self.roster.refusal(identity, h)
        if why:
            why = self._place_of_silent(identity, h, why)
        if why:
            self._refuse(identity, h, why)
            return
        self.roster.add(identity, h)
        log.info("registered %s at %s:%d (pid %d)", h["role"], logs.peer(h["host"]), h["port"], h["pid"])
        if self.roster.complete():
            self._start_job()

    def _place_of_silent(self, identity: bytes, h: dict, why: str) -> str:
        """A REGISTER refused ``why``: where the place it asks for is a member's silent for a
        heartbeat timeout before the job started (``Roster.silent_holder``: dead, its pod
        restarted), that member gives it up and is told so; returns why it is still refused."""
        silent = self.roster.silent_holder(h, time.monotonic() - self.s.heartbeat_timeout_s)
        if silent is None or silent.identity == identity:
            return why
        before = dict(self.roster.members)  # (in registration order, which ranks follow)
        del self.roster.members[silent.identity]
        still = self.roster.refusal(identity, h)
        if still:  # refused for another reason: the silent one keeps its place
            self.roster.members = before
            return still
        log.warning("%s (pid %d on %s) registered, then went silent for more than PS_HEARTBEAT_TIMEOUT=%g s before the "
                    "job started: its place goes to the %s registering now (pid %d)", silent.role, silent.pid,
                    logs.peer(silent.host), self.s.heartbeat_timeout_s, h["role"], h["pid"])
        self.outbox.send(silent.identity, Op.ERROR, NAME, message=f"this {silent.role}'s registration was given up: "
                         f"silent for more than PS_HEARTBEAT_TIMEOUT before the job started")
        return ""

    def _refuse(self, identity: bytes, h: dict, why: str) -> None:
        self.guard.dropped(identity, f"refused {h['op'].name}: {why}", logs.peer(h["from"]))
        self.outbox.send(identity, Op.ERROR, NAME, message=why)

    def _start_job(self) -> None:
        """Every member registered: rank them, open declarations, send everyone the address book."""
        self.roster.assign_ranks()
        workers = len(self.roster.workers())
        self.declarations = Declarations(workers, KeyPlacement(self.s.num_server), self.s.op_timeout_s)
        now = time.monotonic()
        for m in self.roster.members.values():
            m.last_seen = now  # liveness counts from the job's start, not from each registration
        nodes = self.roster.address_book()
        local = self.roster.local_group_size(self.s.enable_async)
        extra = {"local_size": local} if local > 1 else {}
        for m in self.roster.members.values():
            self.outbox.send(m.identity, Op.ADDRESS_BOOK, NAME, rank=m.rank,
                             nodes=nodes, num_workers=workers, num_servers=self.s.num_server, **extra)
        log.info("job started: %d worker(s), %d server(s)%s", workers, self.s.num_server,
                 f", summed locally in groups of {local}" if local > 1 else "")

    def _send_all(self, messages: list[tuple[list[bytes], Op, dict]]) -> None:
        """Send what Barriers and Declarations return, in their order."""
        for identities, op, fields in messages:
            self._send_each(identities, op, **fields)

    def _send_each(self, identities, op: Op, **fields) -> None:
        for identity in identities:
            try:
                self.outbox.send(identity, op, NAME, **fields)
            except zmq.ZMQError as e:  # that peer is gone; the purge will say so
                log.debug("send %s to %s failed: %s", op.name, logs.peer(identity), e)


def run_scheduler(settings: Settings) -> int:
    return Scheduler(settings).run()

