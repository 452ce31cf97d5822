"""The scheduler: one ROUTER socket, one poll loop.

It waits for every worker and server to register, assigns ranks and sends the
address book; then it serves barriers and tensor declarations, exchanges
heartbeats with every node, announces a lost node to everyone (and ends the job:
there is no recovery yet), and ends the job in order once every worker finished: it exits once every member
acknowledged SHUTDOWN (or PS_HEARTBEAT_TIMEOUT passed, naming who did not).
A worker that fails (or its launcher) sends ABORT with its first error line: the
others hear at once which worker failed and why, instead of at a heartbeat timeout.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import zmq

from .. import logs
from ..net import transport
from ..net.guard import PeerGuard
from ..net.limits import Limits
from ..net.outbox import RETRY_INTERVAL_S, Outbox
from ..config import Settings
from ..health import HealthFile
from ..placement import KeyPlacement
from ..net.protocol import Op
from .declarations import Declarations

log = logging.getLogger(__name__)
NAME = "scheduler 0"
# Messages taken per pass of the loop: heartbeats and the purge run whatever the inflow.
MAX_BATCH = 256
# Barriers a job may have open at once (a worker has one; the rest is a peer gone wrong).
MAX_OPEN_BARRIERS = 10_000
# Worker processes on one machine, at most (a machine has a few GPUs).
MAX_LOCAL_SIZE = 1024
# A machine id (host.machine_id: a boot id and a cgroup path), at most this long.
MAX_MACHINE_ID = 512


@dataclass
class Member:
    identity: bytes
    role: str
    host: str
    port: int
    worker_id: int
    local_rank: int
    local_size: int
    pid: int
    machine: str = ""
    rank: int = -1
    last_seen: float = field(default_factory=time.monotonic)
    finished: bool = False

    @property
    def name(self) -> str:
        return transport.node_name(self.role, self.rank)


class Scheduler:
    def __init__(self, settings: Settings, ctx: zmq.Context | None = None):
        self.s = settings
        self.ctx = ctx or transport.context()
        self.sock, self.port = transport.router(self.ctx, settings, settings.root_port)
        # every message counts against its sender's budget: members send a few per second
        self.guard = PeerGuard("scheduler", settings.peer_rate, settings.peer_burst)
        self.outbox = Outbox(self.sock, self.guard, stall_s=settings.heartbeat_timeout_s, names=self._name_of)
        self.limits = Limits(settings.partition_bytes)
        self.members: dict[bytes, Member] = {}
        self.registered = False
        self.barriers: dict[tuple[str, int], set[bytes]] = {}
        self.declarations: Declarations | None = None
        self._last_beat = 0.0
        self._started = time.monotonic()
        self.exit_code: int | None = None
        self._failure = ""          # why the job failed (answered to late registrations)
        self._linger_until = 0.0    # after a failure, keep answering until then
        self._unacked: set[bytes] = set()  # members yet to acknowledge the SHUTDOWN that ended the job
        self._end_reason = ""
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
            if self._unacked:
                log.warning("exiting without the SHUTDOWN acknowledgement of %s within PS_HEARTBEAT_TIMEOUT=%g s",
                            ", ".join(sorted(self.members[i].name for i in self._unacked)),
                            self.s.heartbeat_timeout_s)
            self.sock.close()
        return self.exit_code

    def _drain(self) -> None:
        for _ in range(MAX_BATCH):
            if not self.sock.poll(0):
                return
            identity, header, _ = transport.recv(self.sock, routed=True, guard=self.guard)
            if header is None or not self.guard.charge(identity, self._name_of(identity)):
                continue
            member = self.members.get(identity)
            if member is not None:
                member.last_seen = time.monotonic()
            try:
                self._dispatch(identity, member, header)
            except zmq.ZMQError as e:  # a peer vanished between its message and our reply
                log.warning("could not answer %s: %s", logs.peer(header["from"]), e)

    def _dispatch(self, identity: bytes, member: Member | None, h: dict) -> None:
        op = h["op"]
        if self.exit_code is not None:  # the job failed: late arrivals learn why instead of waiting
            if op == Op.REGISTER:
                self._refuse(identity, h, self._failure)
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
        elif member is None or not self.registered:
            self.guard.dropped(identity, f"dropped {op.name} from an unregistered peer", logs.peer(h["from"]))
        elif op == Op.BARRIER:
            self._barrier(member, h["group"], h["seq"])
        elif op == Op.DECLARE and member.role == "worker" and self._too_big(identity, h):
            pass
        elif op == Op.DECLARE and member.role == "worker":
            for identities, op_out, kwargs in self.declarations.declare(
                    identity, member.rank, h["name"], h["count"], h["dtype"], h["parts"], time.monotonic(),
                    h.get("compression_params")):
                self._send_each(identities, op_out, **kwargs)
        elif op == Op.FINISH and member.role == "worker":
            member.finished = True
            log.info("%s finished", member.name)
            if all(m.finished for m in self.members.values() if m.role == "worker"):
                self._end(0, "done")
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

    def _name_of(self, identity: bytes) -> str:
        member = self.members.get(identity)
        return member.name if member is not None else ""

    # ---- registration ---------------------------------------------------

    def _register(self, identity: bytes, h: dict) -> None:
        if self.registered or identity in self.members:
            self._refuse(identity, h, "registration is closed (the job is already running)")
            return
        role = h["role"]
        if role not in ("worker", "server"):
            self._refuse(identity, h, f"role {logs.peer(role)} cannot register; expected worker or server")
            return
        wrong = _registration_problem(h)
        if wrong:
            self._refuse(identity, h, wrong)
            return
        if role == "worker":
            workers = [m for m in self.members.values() if m.role == "worker"]
            if workers and h["local_size"] != workers[0].local_size:
                self._refuse(identity, h, f"BYTEPS_LOCAL_SIZE={h['local_size']} differs from "
                                          f"{workers[0].local_size} of the workers already registered")
                return
            if h["worker_id"] >= self.s.num_worker:
                self._refuse(identity, h, f"DMLC_WORKER_ID={h['worker_id']} >= DMLC_NUM_WORKER={self.s.num_worker}")
                return
            slot = (h["worker_id"], h["local_rank"])
            if h["worker_id"] >= 0 and any((m.worker_id, m.local_rank) == slot for m in workers):
                self._refuse(identity, h, f"DMLC_WORKER_ID={slot[0]} BYTEPS_LOCAL_RANK={slot[1]} is already taken")
                return
        self.members[identity] = Member(identity, role, h["host"], h["port"], h["worker_id"],
                                        h["local_rank"], h["local_size"], h["pid"], h.get("machine", ""))
        log.info("registered %s at %s:%d (pid %d)", role, logs.peer(h["host"]), h["port"], h["pid"])
        if self._all_registered():
            self._assign_ranks()
            self._send_address_book()

    def _refuse(self, identity: bytes, h: dict, why: str) -> None:
        self.guard.dropped(identity, f"refused {h['op'].name}: {why}", logs.peer(h["from"]))
        self.outbox.send(identity, Op.ERROR, NAME, message=why)

    def _all_registered(self) -> bool:
        workers = [m for m in self.members.values() if m.role == "worker"]
        servers = [m for m in self.members.values() if m.role == "server"]
        if not workers:
            return False
        return len(workers) == self.s.num_worker * workers[0].local_size and len(servers) == self.s.num_server

    def _assign_ranks(self) -> None:
        workers = [m for m in self.members.values() if m.role == "worker"]
        local_size = workers[0].local_size
        taken = {m.worker_id * local_size + m.local_rank for m in workers if m.worker_id >= 0}
        free = iter(r for r in range(len(workers)) if r not in taken)
        for m in workers:  # dict order is registration order
            m.rank = m.worker_id * local_size + m.local_rank if m.worker_id >= 0 else next(free)
        for rank, m in enumerate(m for m in self.members.values() if m.role == "server"):
            m.rank = rank
        self.registered = True
        self.declarations = Declarations(len(workers), KeyPlacement(self.s.num_server), self.s.op_timeout_s)

    def _send_address_book(self) -> None:
        now = time.monotonic()
        for m in self.members.values():
            m.last_seen = now  # liveness counts from the job's start, not from each registration
        nodes = [{"role": m.role, "rank": m.rank, "host": m.host, "port": m.port, "machine": m.machine}
                 for m in self.members.values()]
        workers = sum(m.role == "worker" for m in self.members.values())
        for m in self.members.values():
            self.outbox.send(m.identity, Op.ADDRESS_BOOK, NAME, rank=m.rank,
                           nodes=nodes, num_workers=workers, num_servers=self.s.num_server)
        log.info("job started: %d worker(s), %d server(s)", workers, self.s.num_server)

    # ---- barriers -------------------------------------------------------

    def _barrier(self, member: Member, group: str, seq: int) -> None:
        if group not in ("all", "worker", "server"):
            # group and seq name the barrier, so that the waiting node fails it now, not at its timeout
            self._send_each([member.identity], Op.ERROR, message=f"unknown barrier group {group!r}",
                            group=group, seq=seq)
            return
        if (group, seq) not in self.barriers and len(self.barriers) >= MAX_OPEN_BARRIERS:
            self._send_each([member.identity], Op.ERROR, message=f"more than {MAX_OPEN_BARRIERS} barriers open "
                            f"at once; barrier {seq} of {group!r} refused", group=group, seq=seq)
            return
        arrived = self.barriers.setdefault((group, seq), set())
        arrived.add(member.identity)
        expected = [m.identity for m in self.members.values() if group in ("all", m.role)]
        if arrived.issuperset(expected):
            del self.barriers[(group, seq)]
            self._send_each(expected, Op.BARRIER_DONE, group=group, seq=seq)

    # ---- liveness and the end -------------------------------------------

    def _purge(self) -> None:
        now = time.monotonic()
        if not self.registered:
            if now - self._started > self.s.connect_timeout_s:
                missing = self._missing_summary()
                log.error("not every node registered within GRADPRESS_CONNECT_TIMEOUT_S=%g s: %s",
                          self.s.connect_timeout_s, missing)
                self._end(1, f"registration timed out: {missing}")
            return
        for m in self.members.values():
            silent = now - m.last_seen
            if not m.finished and silent > self.s.heartbeat_timeout_s:
                reason = f"no heartbeat for {silent:.1f} s (PS_HEARTBEAT_TIMEOUT={self.s.heartbeat_timeout_s:g})"
                log.error("lost %s (pid %d on %s): %s", m.name, m.pid, logs.peer(m.host), reason)
                others = [o.identity for o in self.members.values() if o is not m]
                self._send_each(others, Op.NODE_LOST, role=m.role, rank=m.rank, reason=reason)
                self.exit_code = 1
                return

    def _abort(self, identity: bytes, sender: Member | None, h: dict) -> None:
        """A worker failed: tell everyone else who and why, and end the job with an error.

        The sender is the failed worker itself (registered or not), or its launcher, which
        names the worker by pid, DMLC_WORKER_ID and local rank.
        """
        failed = sender if sender is not None and sender.role == "worker" and "pid" not in h else None
        if failed is None and "pid" in h:
            failed = next((m for m in self.members.values() if m.role == "worker" and m.pid == h["pid"]), None)
        if failed is None and h.get("worker_id", -1) >= 0:
            slot = (h["worker_id"], h.get("local_rank", 0))
            failed = next((m for m in self.members.values()
                           if m.role == "worker" and (m.worker_id, m.local_rank) == slot), None)
        if failed is not None and failed.rank >= 0:
            rank = failed.rank
        elif h.get("worker_id", -1) >= 0:
            rank = h["worker_id"] * (failed.local_size if failed else 1) + h.get("local_rank", 0)
        else:
            rank = -1
        name = transport.node_name("worker", rank) if rank >= 0 else f"worker (pid {h.get('pid', '?')})"
        reason = f"failed: {h['reason']}"
        log.error("%s failed: %s", name, logs.peer(h["reason"]))
        self._failure = f"the job failed: {name} {reason}"
        others = [m.identity for m in self.members.values() if m is not failed and m.identity != identity]
        self._send_each(others, Op.NODE_LOST, role="worker", rank=rank, reason=reason)
        self._send_each([identity], Op.SHUTDOWN, reason=self._failure)  # the sender's acknowledgement
        if failed is not None and failed.identity != identity:
            self._send_each([failed.identity], Op.SHUTDOWN, reason=self._failure)
        self.exit_code = 1
        self._linger_until = time.monotonic() + self.s.heartbeat_timeout_s

    def _missing_summary(self) -> str:
        workers = sum(m.role == "worker" for m in self.members.values())
        servers = sum(m.role == "server" for m in self.members.values())
        return (f"{workers} worker process(es) of {self.s.num_worker} machine(s) and "
                f"{servers} of {self.s.num_server} server(s) registered")

    def _send_heartbeats(self) -> None:
        now = time.monotonic()
        if now - self._last_beat < self.s.heartbeat_interval_s:
            return
        self._last_beat = now
        # finished workers too: they wait for SHUTDOWN and would otherwise think us dead
        self._send_each([m.identity for m in self.members.values()], Op.HEARTBEAT)

    def _end(self, code: int, reason: str) -> None:
        self._send_each([m.identity for m in self.members.values()], Op.SHUTDOWN, reason=reason)
        self.exit_code = code
        log.info("job ended: %s", reason)
        # Stay up, answering and resending SHUTDOWN in place of heartbeats, until every member
        # acknowledged it: a scheduler that exits at once can lose what it sent last (its socket
        # closed under unsent data), and members that never heard SHUTDOWN report it lost.
        self._unacked = {m.identity for m in self.members.values()}
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

    def _send_each(self, identities, op: Op, **fields) -> None:
        for identity in identities:
            try:
                self.outbox.send(identity, op, NAME, **fields)
            except zmq.ZMQError as e:  # that peer is gone; the purge will say so
                log.debug("send %s to %s failed: %s", op.name, logs.peer(identity), e)


def _registration_problem(h: dict) -> str:
    """What is wrong with a REGISTER's numbers ('' if nothing): checked before anything is kept."""
    if not 0 <= h["port"] <= 65535:
        return f"port {h['port']} is not a port number"
    if not 1 <= h["local_size"] <= MAX_LOCAL_SIZE:
        return f"BYTEPS_LOCAL_SIZE={h['local_size']} is not in [1, {MAX_LOCAL_SIZE}]"
    if not 0 <= h["local_rank"] < h["local_size"]:
        return f"BYTEPS_LOCAL_RANK={h['local_rank']} is not in [0, BYTEPS_LOCAL_SIZE={h['local_size']})"
    if h["worker_id"] < -1:
        return f"DMLC_WORKER_ID={h['worker_id']} is negative"
    if h["pid"] < 0:
        return f"pid {h['pid']} is negative"
    if len(h.get("machine", "")) > MAX_MACHINE_ID:
        return (f"machine id of {len(h['machine'])} characters (at most {MAX_MACHINE_ID}): the address book "
                f"repeats every node's to every node")
    return ""


def run_scheduler(settings: Settings) -> int:
    return Scheduler(settings).run()

