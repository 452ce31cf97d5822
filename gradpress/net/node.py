"""A server's or worker's link to the scheduler: registration, address book, heartbeats.

The link owns one DEALER socket and is driven by its owner's poll loop (ZeroMQ
sockets belong to one thread): the loop polls ``link.sock``, hands what arrives to
:meth:`SchedulerLink.handle`, and calls :meth:`SchedulerLink.tick` on every pass.
The scheduler heartbeats every node and every node heartbeats the scheduler, so
each side notices the other's death within the heartbeat timeout.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from dataclasses import dataclass

import zmq

from . import transport
from .. import host
from ..config import Settings, agreed
from ..errors import JobError, NodeLostError, OpTimeoutError, RegistrationRefused
from ..health import HealthFile
from .handshake import HandshakeWatch
from .protocol import MAX_REASON_CHARS, Op

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeInfo:
    role: str
    rank: int
    host: str
    port: int
    machine: str = ""   # nodes with the same one share CPUs (host.machine_id)
    ports: tuple[int, ...] = ()   # a server's lanes (transport.lanes_router), the first ``port``

    def port_for(self, rank: int) -> int:
        """Where the worker of ``rank`` connects: its lane, or the one port."""
        return self.ports[rank % len(self.ports)] if self.ports else self.port

    @property
    def name(self) -> str:
        return transport.node_name(self.role, self.rank)


@dataclass(frozen=True)
class AddressBook:
    """Who is in the job, as the scheduler announced it."""
    rank: int
    nodes: tuple[NodeInfo, ...]
    num_workers: int
    num_servers: int
    local_size: int = 1   # workers of a machine that reduce locally (worker/local.py); 1: none

    @property
    def servers(self) -> list[NodeInfo]:
        return sorted((n for n in self.nodes if n.role == "server"), key=lambda n: n.rank)

    def sharing(self, machine: str) -> list[NodeInfo]:
        """The workers and servers whose CPUs are ``machine``'s (none where the id is unknown)."""
        return [n for n in self.nodes if machine and n.machine == machine and n.role in ("worker", "server")]


def address_book(h: dict, role: str) -> AddressBook:
    """The scheduler's ADDRESS_BOOK, checked: a wrong one (a scheduler's bug) would have this
    node average over a wrong number of workers, or talk to nodes outside the job.

    Raises:
        JobError: what is wrong with it.
    """
    try:
        nodes = tuple(NodeInfo(n["role"], n["rank"], n["host"], n["port"], n.get("machine", ""),
                               tuple(n.get("ports", ()))) for n in h["nodes"])
    except (KeyError, TypeError, AttributeError) as e:
        raise JobError(f"{role}: the scheduler's address book has a malformed node (missing or wrong: {e})") from None
    def wrong(problem: str) -> JobError:
        return JobError(f"{role}: the scheduler's address book is wrong: {problem}")

    ports = [p for n in nodes for p in (n.port, *n.ports)]
    if any(not isinstance(n.role, str) or type(n.rank) is not int or not isinstance(n.host, str) for n in nodes) \
            or any(type(p) is not int or not 0 <= p <= 65535 for p in ports):
        raise wrong("a node's role, rank, host or port is of the wrong type or out of range")
    ranks = {r: sorted(n.rank for n in nodes if n.role == r) for r in ("worker", "server")}
    for r, count in (("worker", h["num_workers"]), ("server", h["num_servers"])):
        if ranks[r] != list(range(max(count, 1))):
            raise wrong(f"{r} ranks {ranks[r]} for num_{r}s={count}")
    if h["rank"] not in ranks.get(role, []):
        raise wrong(f"this {role}'s rank {h['rank']} is not among them")
    local = h.get("local_size", 1)
    if type(local) is not int or local < 1 or h["num_workers"] % local:
        raise wrong(f"local_size={local!r} for {h['num_workers']} workers")
    return AddressBook(h["rank"], nodes, h["num_workers"], h["num_servers"], local)


def _unlaunched_hint(settings: Settings) -> str:
    """What to do, where nothing says where the job's scheduler is (no DMLC_PS_ROOT_URI, no
    DMLC_ROLE, no job file): the process was most likely started without a launcher."""
    if settings.config_file or any(k in os.environ for k in ("DMLC_PS_ROOT_URI", "DMLC_ROLE")):
        return ""
    return ("DMLC_PS_ROOT_URI and DMLC_ROLE are unset, so this process was not started by a launcher: "
            "run it as `gradpress-launch --local --workers N --servers M -- python <script>`, or set the "
            "DMLC_* variables as BytePS's launcher does (docs/deploy.md)")


class SchedulerLink:
    def __init__(self, settings: Settings, role: str, ctx: zmq.Context, port: int = 0,
                 lanes: list[int] | None = None):
        self.settings = settings
        self.role = role
        self.port = port
        self.lanes = lanes if lanes and len(lanes) > 1 else None   # a server's ports, lane by lane
        self.host = transport.announce_host(settings)
        self.watch: HandshakeWatch | None = None  # until registered: why the scheduler cannot be reached
        self.sock = transport.dealer(ctx, settings, settings.root_uri, settings.root_port,
                                     f"{role}-{uuid.uuid4().hex[:12]}".encode(), before_connect=self._watch)
        self.health = HealthFile(settings.health_file, settings.heartbeat_interval_s)
        self.book: AddressBook | None = None
        self.name = transport.node_name(role, -1)
        self._last_sent = 0.0
        self._last_heard = time.monotonic()
        self.shut_down = False  # SHUTDOWN arrived: the scheduler may go silent now, by design
        self.announced = False  # REGISTER sent (or being sent): the scheduler may know this node
        self._last_tick = time.monotonic()

    def _watch(self, sock: zmq.Socket) -> None:
        self.watch = HandshakeWatch(sock, self.settings, self.role)

    def register(self) -> AddressBook:
        """Announce this node and wait for the address book (deadline: connect timeout)."""
        s = self.settings
        self.announced = True  # (first: a signal may end the send after the message went)
        self._send_registering(Op.REGISTER, role=self.role, host=self.host, port=self.port,
                   worker_id=s.worker_id if self.role == "worker" else -1,
                   local_rank=s.local_rank, local_size=s.local_size, pid=os.getpid(),
                   machine=host.machine_id(), **({"local_reduce": s.local_reduce} if self.role == "worker" else {}),
                   **({"ports": self.lanes} if self.lanes else {}),
                   **({"server_id": s.server_id} if self.role == "server" and s.server_id >= 0 else {}),
                   enable_async=s.enable_async, **({"launch": s.launch_id} if s.launch_id else {}),
                   **({"agree": agreed(s)} if self.role == "worker" else {}))
        deadline = time.monotonic() + s.connect_timeout_s
        hint = _unlaunched_hint(s)
        if hint:  # a script run with plain `python`: say so now, not at the deadline
            log.warning("%s: waiting up to GRADPRESS_CONNECT_TIMEOUT_S=%g s for a scheduler at %s:%d; %s",
                        self.role, s.connect_timeout_s, s.root_uri, s.root_port, hint)
        try:
            self._wait_for_book(deadline, hint)
        finally:
            self.watch.close()
        self.health.ready(f"{self.name} registered")
        return self.book

    def _wait_for_book(self, deadline: float, hint: str) -> None:
        s, watch = self.settings, self.watch
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(watch.monitor, zmq.POLLIN)
        while self.book is None:
            watch.check()
            left = deadline - time.monotonic()
            if left <= 0:
                raise OpTimeoutError(
                    f"{self.role}: no address book from the scheduler at {s.root_uri}:{s.root_port} "
                    f"within GRADPRESS_CONNECT_TIMEOUT_S={s.connect_timeout_s:g} s "
                    f"(expecting {s.num_worker} worker machine(s) and {s.num_server} server(s))"
                    + "".join(f"; {h}" for h in (watch.hint(), hint) if h))
            if self.sock in dict(poller.poll(min(left, s.heartbeat_interval_s) * 1000)):
                _, header, _ = transport.recv(self.sock, routed=False)
                if header is not None:
                    self.handle(header)
            if self.book is None and time.monotonic() - self._last_sent >= s.heartbeat_interval_s:
                self._send_registering(Op.HEARTBEAT)  # still here: the scheduler hears from us while others register

    def _send_registering(self, op: Op, **fields) -> None:
        """A send before the job starts: it waits (PS_HEARTBEAT_TIMEOUT at most) for a connection to
        take it, or for the watch to say why none will; it ended in ZeroMQ's bare Again."""
        s = self.settings
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLOUT)
        poller.register(self.watch.monitor, zmq.POLLIN)
        deadline = time.monotonic() + s.heartbeat_timeout_s
        while (left := deadline - time.monotonic()) > 0:
            self.watch.check()
            if dict(poller.poll(left * 1000)).get(self.sock, 0) & zmq.POLLOUT:
                self._send(op, **fields)
                return
        self.watch.check()
        raise OpTimeoutError(f"{self.role}: the scheduler at {s.root_uri}:{s.root_port} took no message within "
                             f"PS_HEARTBEAT_TIMEOUT={s.heartbeat_timeout_s:g} s: it refuses the connection (a job "
                             f"secret or GRADPRESS_SECURITY other than this node's {s.security}?) or reads nothing"
                             + (f"; {self.watch.hint()}" if self.watch.hint() else ""))

    def handle(self, header: dict) -> dict | None:
        """Process a scheduler message; returns it when the owner must act on it.

        Raises:
            NodeLostError: the scheduler reports a lost node.
            JobError: the scheduler refused this node or ended the job with an error.
        """
        self._last_heard = time.monotonic()
        op = header["op"]
        if op == Op.HEARTBEAT:
            return None
        if op == Op.ADDRESS_BOOK:
            self.book = address_book(header, self.role)
            self.name = transport.node_name(self.role, header["rank"])
            return None
        if op == Op.NODE_LOST:
            who = header.get("name") or f"{header['role']} {header['rank']}"
            raise NodeLostError(f"{self.name}: lost {who}: {header['reason']}")
        if op == Op.SHUTDOWN:
            # acknowledged at once, so that the scheduler stays up until every member knows
            # (a duplicate, resent while our first acknowledgement travelled, is acknowledged too)
            self._send(Op.SHUTDOWN_ACK)
            self.shut_down = True
            if header["reason"] != "done":
                raise JobError(f"{self.name}: the scheduler ended the job: {header['reason']}")
            return header
        if op == Op.ERROR and "name" not in header and self.book is None:
            raise RegistrationRefused(f"{self.role}: the scheduler refused registration: {header['message']}")
        return header

    def tick(self) -> None:
        """Send a heartbeat if due; raise if the scheduler has gone silent (unless it ended the job)."""
        now = time.monotonic()
        stalled = now - self._last_tick
        self._last_tick = now
        if stalled > 2 * self.settings.heartbeat_interval_s:
            # this process did not run (stopped, starved): what the scheduler sent meanwhile may
            # not have been read yet, so the time we were away does not count as its silence
            self._last_heard = min(now, self._last_heard + stalled)
        if now - self._last_sent >= self.settings.heartbeat_interval_s:
            self._send(Op.HEARTBEAT)
        silent = now - self._last_heard
        if silent > self.settings.heartbeat_timeout_s and not self.shut_down:
            raise NodeLostError(f"{self.name}: lost scheduler 0: no heartbeat for {silent:.1f} s "
                                f"(PS_HEARTBEAT_TIMEOUT={self.settings.heartbeat_timeout_s:g})")
        self.health.beat()

    def send(self, op: Op, buffers=(), **fields) -> None:
        self._send(op, buffers, **fields)

    def abort(self, reason: str) -> None:
        """Tell the scheduler this node failed and why (it tells every other node now); a
        scheduler already gone is no error (delivered within the socket's linger)."""
        with contextlib.suppress(zmq.ZMQError):
            self._send(Op.ABORT, reason=reason[:MAX_REASON_CHARS])

    def _send(self, op: Op, buffers=(), **fields) -> None:
        self._last_sent = time.monotonic()
        transport.send(self.sock, op, self.name, buffers, **fields)

    def close(self) -> None:
        if self.shut_down:  # (the job ended: a node that failed, its script perhaps hanging, stays judged)
            self.health.finished(f"{self.name} left the job")
        if self.watch is not None:
            self.watch.close()
        self.sock.close()
