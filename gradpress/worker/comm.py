"""The worker's communication thread: it owns every socket and does all the work.

Callers put typed commands (``commands.py``) on its queue and wake it through a
pipe. It talks to the scheduler itself (declarations, barriers, the end of the job),
hands partitions to ``PartitionFlight`` (``flight.py``: credit, rounds, stages,
server replies) and enforces every deadline from one table (``deadlines.py``). Errors are
recorded on the future concerned; a fatal one fails every future that waits.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

import zmq

from ..config import Settings
from ..errors import JobError, NodeLostError, TensorMismatchError
from ..net import shm, transport
from ..net.node import AddressBook, SchedulerLink
from ..net.protocol import Op
from ..trace import Tracer
from . import commands as cmd
from .abort import exit_later
from .deadlines import Deadlines
from .declarations import Declarations
from .flight import PartitionFlight
from .future import Future
from .host_copies import HostCopies
from .keys import KeyTable, StateRequest, Tensor
from .local import LocalGroup
from .relay import Relay
from .stages import PartitionStages
from .waker import Waker

log = logging.getLogger(__name__)


class CommunicationThread(threading.Thread):
    def __init__(self, settings: Settings, ctx: zmq.Context, tracer: Tracer):
        super().__init__(name="gp-worker-comm", daemon=True)
        self.s = settings
        self.ctx = ctx
        self.tracer = tracer
        self.book: AddressBook | None = None
        self.fatal: JobError | None = None
        self.stages: PartitionStages | None = None
        self.ready = threading.Event()
        # it does the worker's GPU work and nothing else: streams.py keeps its device and stream
        self.owns_gpu_work = True
        self.stopped = threading.Event()
        self.table = KeyTable()
        self._commands: queue.Queue = queue.Queue()
        self.waker = Waker()
        self.wake = self.waker.wake  # (from any thread: waker.py)
        self.flight: PartitionFlight | None = None
        self._barriers: dict[tuple[str, int], Future] = {}
        self._barrier_seq = 0
        self._finish: Future | None = None
        self._deadlines = Deadlines()
        self.declarations = Declarations(self.table, self._deadlines, settings.op_timeout_s,
                                         lambda **fields: self.link.send(Op.DECLARE, **fields),
                                         self._start_push_pull)
        self._handlers = {cmd.Declare: self.declarations.declare, cmd.StartPushPull: self._start_push_pull,
                          cmd.Barrier: self._barrier, cmd.GetServerState: self._get_server_state,
                          cmd.LoadServerState: self._load_state, cmd.LoadCompressorState: self._load_state,
                          cmd.Finish: self._finish_job,
                          cmd.Abort: self._abort_job, cmd.Release: self._release}

    def submit(self, command: Any) -> None:
        """Hand ``command`` to the thread (from any thread)."""
        if self.fatal:
            raise self.fatal
        if self.stopped.is_set():
            raise JobError("gradpress was shut down on this worker")
        self._commands.put(command)
        if self.stopped.is_set():  # it stopped meanwhile: its queue may have been failed before this put
            for future in self._queued():
                future.fail(self.fatal or JobError("gradpress was shut down on this worker"))
        self.wake()

    # ---- the communication thread: the loop ----------------------------------

    def run(self) -> None:
        self.link = self.group = None
        servers: list[zmq.Socket] = []
        try:
            self.group = LocalGroup.bind(self.s, self.ctx)  # its port goes into the address book
            self.link = SchedulerLink(self.s, "worker", self.ctx, self.group.port if self.group else 0)
            self.book, identity = self.link.register(), self.link.sock.getsockopt(zmq.IDENTITY)
            servers = [transport.dealer(self.ctx, self.s, n.host, n.port_for(self.book.rank), identity, io_thread=i)
                       for i, n in enumerate(self.book.servers)]  # at this rank's lane, each on an I/O thread
            use_shm = self.s.shm and not self.s.enable_async and shm.available()
            local = [use_shm and n.host == self.link.host for n in self.book.servers]
            servers += self.group.join(self.book, len(servers)) if self.group else []  # the machine's workers
            local += [use_shm] * (len(servers) - len(local))
            self.stages = PartitionStages(self.link.name, servers, local, self.tracer, HostCopies(self.wake))
            self.flight = PartitionFlight(self.s, self.stages, self.table, self._deadlines)
            if self.group is not None and self.group.active:
                self.flight.relay = Relay(self.group, self.link.name, self.stages.peer_chunks, self.flight,
                                          self.stages.host_copies)
                self.flight.describe = self.group.describe
            self.ready.set()
            self._loop(servers)
            for fut in self._waiting():  # the job ended (SHUTDOWN, or finish() gave up): none is answered now
                fut.fail(JobError(f"{fut.what}: the job ended before it finished (gradpress was shut down "
                                  "on this worker)"))
        except JobError as e:
            self._die(e)
        except BaseException as e:  # never leave callers waiting on a dead thread
            log.exception("worker communication thread failed")
            self._die(JobError(f"worker communication thread failed: {e!r}"), report=True)
        finally:
            self.ready.set()
            for sock in servers:
                sock.close()
            if self.group is not None:
                self.group.close()
            if self.stages is not None:
                self.stages.close()
            if self.link is not None:
                self.tracer.write(self.link.name)
                self.link.close()
            self.waker.close()
            transport.deliver_queued(self.ctx)  # the context is this thread's (``transport.own_context``)

    def _loop(self, servers: list[zmq.Socket]) -> None:
        poller = zmq.Poller()
        relay = self.flight.relay
        for sock in [self.link.sock] + servers + ([relay.group.router] if relay else []):
            poller.register(sock, zmq.POLLIN)
        poller.register(self.waker.fd, zmq.POLLIN)
        timeout_ms = self.s.heartbeat_interval_s * 1000 / 2
        while not self.stopped.is_set():
            ready = dict(poller.poll(timeout_ms))
            if self.waker.fd in ready:
                self.waker.taken()
            self.stages.host_copies.run_finished()
            while not self._commands.empty():
                command = self._commands.get_nowait()
                self._handlers[type(command)](command)
                command = None  # a push_pull's command holds its tensors: not until the next one
            if self.link.sock in ready:
                while self.link.sock.poll(0):
                    self._from_scheduler()
            for rank, sock in enumerate(servers):  # (local peers too: a key's owner answers as its server)
                while sock in ready and sock.poll(0):
                    self.flight.from_server(rank, sock)
            if relay is not None and relay.group.router in ready:
                relay.drain()
            self.flight.dispatch()
            self.link.tick()
            self._deadlines.expire(time.monotonic())

    # ---- commands ---------------------------------------------------------------

    def _start_push_pull(self, c: cmd.StartPushPull) -> None:
        self.flight.start(c.job, c.priority)

    def _barrier(self, c: cmd.Barrier) -> None:
        self._barrier_seq += 1
        self._barriers[(c.group, self._barrier_seq)] = c.future
        self.link.send(Op.BARRIER, group=c.group, seq=self._barrier_seq)

    def _get_server_state(self, c: cmd.GetServerState) -> None:
        request = StateRequest(c.future, {wk.index for wk in c.tensor.keys})
        for wk in c.tensor.keys:
            if wk.state_to_load is not None:  # loaded, not yet sent: that is the state
                request.answer(wk.index, *wk.state_to_load)
                continue
            wk.state_request = request
            transport.send(self.stages.servers[wk.server], Op.STATE_GET, self.link.name, key=wk.key)
        self._deadlines.add_future(time.monotonic() + self.s.op_timeout_s, c.future, self.s.op_timeout_s)

    def _load_state(self, c: cmd.LoadServerState | cmd.LoadCompressorState) -> None:
        try:
            if isinstance(c, cmd.LoadServerState):
                self.table.load_server_state(c.name, c.states)
            else:
                self.table.load_compressor_state(c.name, c.state)
            c.future.set()
        except ValueError as e:
            c.future.fail(e)

    def _release(self, c: cmd.Release) -> None:
        busy = self.flight.busy(c.names) + self.declarations.parked(c.names)
        if busy:
            c.future.fail(ValueError(f"cannot release tensors {busy}: a push_pull of them is still under way"))
            return
        tensors = self.table.release(c.names)
        self.stages.forget(tensors)
        if self.flight.relay is not None:
            self.flight.relay.forget([wk.key for t in tensors for wk in t.keys])
        if c.servers:  # (a server that never had the key ignores it)
            for t in tensors:
                for wk in t.keys:
                    transport.send(self.stages.servers[wk.server], Op.RELEASE, self.link.name, key=wk.key)
        c.future.set()

    def _finish_job(self, c: cmd.Finish) -> None:
        self._finish = c.future
        # busy: push_pulls of its own still under way (sent, queued, waiting for a declaration or
        # for their rows), whose pushes may reach a server after the scheduler's word that this
        # worker left (Op.LEFT): the scheduler then sends none
        busy = c.busy or self.flight.busy(list(self.table.tensors)) or self.declarations.futures()
        self.link.send(Op.FINISH, **({"busy": True} if busy else {}))

    def _abort_job(self, c: cmd.Abort) -> None:
        # the scheduler answers with SHUTDOWN, which ends this thread through _die
        self.link.send(Op.ABORT, reason=c.reason)

    def _from_scheduler(self) -> None:
        _, h, _ = transport.recv(self.link.sock, routed=False)
        if h is None:
            return
        h = self.link.handle(h)
        if h is None:
            return
        op = h["op"]
        if op == Op.DECLARED:
            self._declared(h)
        elif op == Op.ERROR and "name" in h:
            self.declarations.declared(None, h["name"], TensorMismatchError(h["message"]))
        elif op == Op.ERROR and "group" in h:
            fut = self._barriers.pop((h["group"], h.get("seq")), None)
            if fut is not None:
                fut.fail(JobError(f"barrier of group {h['group']!r}: {h['message']}"))
        elif op == Op.BARRIER_DONE:
            fut = self._barriers.pop((h["group"], h["seq"]), None)
            if fut is not None:
                fut.set()
        elif op == Op.LEFT:  # a worker finished while the job goes on: its machine's rounds may wait on it
            if self.flight.relay is not None:
                self.flight.peer_left(h["rank"], h["reason"])
        elif op == Op.SHUTDOWN:
            if self._finish is not None:
                self._finish.set()
            self.stopped.set()
        else:
            log.warning("dropped unexpected %s from the scheduler", op.name)

    def _declared(self, h: dict) -> None:
        first = self.declarations.first(h["name"])
        if first is None:
            return
        # a row-sparse tensor's share s lives on server s (the row hash), whatever the byte placement says
        servers = h["servers"] if first.layout is None else list(range(len(first.parts)))
        t = Tensor(h["name"], first.count, first.dtype, h["tensor_id"], first.parts, servers, first.spec,
                   first.layout)
        try:
            self.table.add(t, len(self.book.servers))
            if self.flight.relay is not None:
                self.group.assign(t)
        except ValueError as e:
            self.declarations.declared(None, t.name, JobError(f"tensor {t.name!r}: {e}"))
            return
        self.declarations.declared(t, t.name)

    def _die(self, error: JobError, report: bool = False) -> None:
        """Record a fatal error, fail everything that waits, and make sure the process stops;
        ``report``: this worker's own error, which the scheduler hears (it stops the others now)."""
        self.fatal = error
        self.stopped.set()
        log.error("%s", error)
        if report and self.link is not None:
            self.link.abort(str(error))
        for fut in self._waiting():
            fut.fail(error)
        if isinstance(error, NodeLostError) and self._finish is None:
            exit_later(self.s.heartbeat_timeout_s, error)

    def _waiting(self) -> list[Future]:
        """Every future still to be answered, the queued commands' included (taking them)."""
        waiting = self.flight.waiting() if self.flight else []
        waiting += self.declarations.futures()
        waiting += list(self._barriers.values())
        waiting += [wk.state_request.future for wk in self.table.values() if wk.state_request is not None]
        return waiting + ([self._finish] if self._finish else []) + self._queued()

    def _queued(self) -> list[Future]:
        """The futures of the commands still queued, taking them (a push_pull's job's too)."""
        waiting = []
        while not self._commands.empty():
            waiting += cmd.waiters(self._commands.get_nowait())
        return waiting

