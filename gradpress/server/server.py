"""The server process: one I/O thread owns the sockets, engine threads do the sums.

The I/O thread registers with the scheduler (announcing the port its ROUTER got),
then routes every push, pull and key initialisation to the engine that owns the
key, and forwards the engines' replies to the workers. Keys are pinned to the
engine holding the fewest bytes when the key is first initialised. Replies are
forwarded without being decoded; an engine's failure arrives on a report channel of
its own, as an ERROR message, and stops the server with a JobError that names it.
The I/O thread also owns one engine that is never started: it sums the keys of at most
``engine.INLINE_MAX_BYTES`` (a hand-off costs more than their work), and every key of a
server with no engine threads (``engine.engine_count``: set so, or too few cores of its own).
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np
import zmq

from .. import allocator, logs
from ..net import transport
from ..net.guard import PeerGuard
from ..net.limits import Limits
from ..net.outbox import RETRY_INTERVAL_S, Outbox
from ..config import Settings
from ..errors import JobError, NodeLostError
from ..compressors.warmup import warm_up
from ..net.node import SchedulerLink
from ..trace import Tracer
from ..net.protocol import Op
from ..processes import Terminated
from .budget import KeyBudget
from .engine import CHECK_WAITS, INLINE_MAX_BYTES, STOP, Engine, local_engine_count

log = logging.getLogger(__name__)
# Messages taken from one socket per pass of the loop: heartbeats are due whatever the inflow.
MAX_BATCH = 256
# a round open this share of GRADPRESS_OP_TIMEOUT_S: its workers hear whose push it waits for (waits.py)
STALLED_AFTER = 0.5


class Server:
    def __init__(self, settings: Settings, ctx: zmq.Context | None = None):
        self.s = settings
        self.ctx = ctx or transport.context(settings)
        # one endpoint per lane, each on its own I/O thread: the workers' connections (and with
        # CURVE their encryption) spread over the server's cores
        self.sock, self.ports = transport.lanes_router(self.ctx, settings, settings.server_port,
                                                       transport.server_lanes(settings))
        self.port = self.ports[0]
        # a server charges a peer only for what it must refuse: workers' pushes are never limited
        self.guard = PeerGuard("server", settings.peer_rate, settings.peer_burst)
        self.outbox = Outbox(self.sock, self.guard, stall_s=settings.heartbeat_timeout_s)
        self.limits = Limits(settings.partition_bytes)
        self.link = SchedulerLink(settings, "server", self.ctx, self.port, lanes=self.ports)
        self._reply_addr = f"inproc://gp-server-replies-{os.getpid()}-{id(self)}"
        self.replies = self.ctx.socket(zmq.PULL)
        self.replies.bind(self._reply_addr)
        self._report_addr = f"inproc://gp-server-reports-{os.getpid()}-{id(self)}"
        self.reports = self.ctx.socket(zmq.PULL)
        self.reports.bind(self._report_addr)
        self.engines: list[Engine] = []        # engine threads
        self.io_engine: Engine | None = None    # the I/O thread's own: small keys, or all of them
        self.tracer = Tracer(settings.trace)
        self.key_engine: dict[int, Engine] = {}
        self.key_bytes: dict[int, int] = {}     # each key's share of its engine's load_bytes
        self.budget = KeyBudget(settings)       # the keys and bytes members may make it hold

    def run(self) -> int:
        """Register, serve until the scheduler says the job is over. Returns the exit code."""
        allocator.configure(self.s)
        warm_up("server")  # before registering: compiling later would silence the heartbeats
        try:
            book = self.link.register()
            name = self.link.name
            threads = local_engine_count(self.s.server_engine_threads, book)
            self.engines = [Engine(i, self.ctx, self._reply_addr, self._report_addr, name, book.num_workers,
                                   self.s.enable_async, self.tracer, self.s.op_timeout_s * STALLED_AFTER)
                            for i in range(threads + 1)]
            self.io_engine = self.engines.pop()
            for e in self.engines:
                e.start()
            log.info("%s serving on port%s %s with %s", name, "s" if len(self.ports) > 1 else "",
                     ", ".join(map(str, self.ports)),
                     f"{threads} engine thread(s), keys of up to {INLINE_MAX_BYTES} bytes summed on its I/O thread"
                     if threads else "the sums on its I/O thread")
            return self._loop()
        except JobError as e:
            log.error("%s", e)
            if self._own_failure(e):  # the scheduler tells every worker why, now
                self.link.abort(str(e))
            return 1
        finally:
            if self.io_engine is not None:
                self.io_engine.close()
            for e in self.engines:
                e.inbox.put(STOP)
            for e in self.engines:
                e.join(timeout=5)
            self.replies.close()
            self.reports.close()
            self.sock.close()
            self.link.close()
            self.tracer.write(self.link.name)

    def _own_failure(self, error: JobError) -> bool:
        """Whether ``error`` is this server's own, in the job: an engine's failure once it
        served, or a SIGTERM once the scheduler may know it (a REGISTER sent). Not the
        scheduler's word (a refusal, the job ended, a lost node), which it already knows:
        an ABORT would end a job still waiting for a server, a restarted pod say."""
        if isinstance(error, Terminated):
            return self.link.announced
        return self.link.book is not None and not self.link.shut_down and not isinstance(error, NodeLostError)

    def _loop(self) -> int:
        poller = zmq.Poller()
        for sock in (self.sock, self.link.sock, self.replies, self.reports):
            poller.register(sock, zmq.POLLIN)
        check_s = min(1.0, self.s.op_timeout_s / 20)  # (a round's wait is found this late at most)
        timeout_ms = min(self.s.heartbeat_interval_s / 2, check_s) * 1000
        next_check = time.monotonic() + check_s
        while True:
            ready = dict(poller.poll(RETRY_INTERVAL_S * 1000 if self.outbox.pending else timeout_ms))
            if self.reports in ready:
                self._engine_report()
            if self.replies in ready:
                self._forward_replies()
            if self.sock in ready:
                self._drain_workers()
            if self.link.sock in ready:
                while self.link.sock.poll(0):
                    _, header, _ = transport.recv(self.link.sock, routed=False)
                    message = None if header is None else self.link.handle(header)
                    if message is not None and message["op"] == Op.SHUTDOWN:
                        log.info("%s: job done, shutting down", self.link.name)
                        return 0
                    if message is not None and message["op"] == Op.DECLARED:
                        self.budget.declared(message, self.link.book.rank)
                    if message is not None and message["op"] == Op.LEFT:
                        # every healthy job's too (its first worker to end): the reason, which says
                        # why a round still open fails, goes with the engines' warning where one does
                        log.info("%s: worker %d finished while other workers go on", self.link.name, message["rank"])
                        for engine in [self.io_engine, *self.engines]:
                            self._hand(engine, b"", message, [])
            # every pass, whatever the inflow: each drain above takes at most MAX_BATCH messages
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + check_s
                self._check_waits()
            self.outbox.flush()
            self.guard.report()
            self.link.tick()

    def _drain_workers(self) -> None:
        for _ in range(MAX_BATCH):
            if not self.sock.poll(0):
                return
            identity, header, frames = transport.recv(self.sock, routed=True, guard=self.guard)
            if header is None:
                continue
            op = header["op"]
            if op not in (Op.INIT_KEY, Op.PUSH, Op.PULL, Op.STATE_GET, Op.STATE, Op.RELEASE):
                self.guard.dropped(identity, f"dropped unexpected {op.name}", logs.peer(header["from"]))
                self.guard.charge(identity)
                continue
            if op == Op.INIT_KEY and "sparse" not in header:  # a row-sparse share is checked by its own rules
                try:  # before an engine allocates anything for it
                    self.limits.check_count(header["count"], header["dtype"], f"INIT_KEY of key {header['key']}")
                except ValueError as e:
                    self._error(identity, header, str(e))
                    continue
            if op == Op.RELEASE:
                self._release(identity, header)
                continue
            engine = self.key_engine.get(header["key"])
            if engine is None:
                if op != Op.INIT_KEY:
                    self._error(identity, header, f"unknown key {header['key']}: no INIT_KEY was received for it")
                    continue
                nbytes = header["count"] * np.dtype(header["dtype"]).itemsize
                refused = self.budget.refusal(header["key"], nbytes)
                if refused:
                    self._error(identity, header, refused)
                    continue
                engine = self.io_engine if nbytes <= INLINE_MAX_BYTES or not self.engines \
                    else min(self.engines, key=lambda e: (e.load_bytes, e.index))
                self.key_bytes[header["key"]] = nbytes
                engine.load_bytes += self.key_bytes[header["key"]]
                self.key_engine[header["key"]] = engine
            self._hand(engine, identity, header, frames)

    def _hand(self, engine: Engine, identity: bytes, header: dict, frames: list) -> None:
        """Give a message to its key's engine: queued for its thread, or served here and now."""
        if engine is not self.io_engine:
            engine.inbox.put((identity, header, frames))
            return
        for reply in engine.serve(identity, header, frames):
            self.outbox.send(reply.to, reply.op, self.link.name, reply.buffers, **reply.fields)

    def _check_waits(self) -> None:
        """Each engine's look for rounds a worker holds up: queued for its thread, or made here."""
        for engine in self.engines:
            engine.inbox.put(CHECK_WAITS)
        for reply in self.io_engine.check_waits():
            self.outbox.send(reply.to, reply.op, self.link.name, reply.buffers, **reply.fields)

    def _release(self, identity: bytes, header: dict) -> None:
        """A key no worker uses any more: its engine drops it after the work queued before
        (a key released twice, or never given to this server, is no error)."""
        engine = self.key_engine.pop(header["key"], None)
        if engine is not None:
            self.budget.release(header["key"])
            engine.load_bytes -= self.key_bytes.pop(header["key"])  # (only this thread writes it)
            self._hand(engine, identity, header, [])

    def _engine_report(self) -> None:
        """An engine's ERROR: it failed and its keys can make no progress, so the server stops."""
        _, header, _ = transport.recv(self.reports, routed=False)
        if header is None or header["op"] != Op.ERROR:
            raise JobError(f"{self.link.name}: an engine thread sent a report that is not an ERROR; "
                           f"see the log above")
        raise JobError(f"{self.link.name}: {header['message']}")

    def _forward_replies(self) -> None:
        for _ in range(MAX_BATCH):
            if not self.replies.poll(0):
                return
            frames = self.replies.recv_multipart(copy=False)
            self.outbox.send_frames(frames[0].bytes, frames[1:])

    def _error(self, identity: bytes, header: dict, message: str) -> None:
        """Refuse a message: an ERROR to its sender (charged to its budget), logged once per sender."""
        self.guard.dropped(identity, f"dropped {header['op'].name}: {message}", logs.peer(header["from"]))
        if self.guard.charge(identity):
            self.outbox.send(identity, Op.ERROR, self.link.name, message=message, key=header["key"])


def run_server(settings: Settings) -> int:
    return Server(settings).run()
