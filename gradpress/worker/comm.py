"""The worker's communication thread: it owns every socket and does all the work.

Callers put typed commands (``commands.py``) on its queue and wake it through a
pipe. It takes partitions in priority order within the credit, runs each through
its stages (``stages.py``), routes replies to the key they belong to (``keys.py``)
and enforces every deadline from one table (``deadlines.py``). Errors are recorded
on the future concerned; a fatal one fails every future that waits.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any

import numpy as np
import zmq

from ..config import Settings
from ..errors import JobError, NodeLostError, OpTimeoutError, TensorMismatchError
from ..net import shm, transport
from ..net.node import AddressBook, SchedulerLink
from ..net.protocol import Op
from ..trace import Tracer
from . import commands as cmd
from .deadlines import Deadlines
from .future import Future
from .jobs import PartitionOp, Tensor
from .keys import KeyTable, StateRequest
from .scheduling import CreditQueue
from .stages import PartitionStages

log = logging.getLogger(__name__)
HELD_FIRST = 1 << 62  # a partition that waited for its key's previous round goes next


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
        self.stopped = threading.Event()
        self.table = KeyTable()
        self._commands: queue.Queue = queue.Queue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._declaring: dict[str, list[cmd.Declare]] = {}
        self._queue = CreditQueue(settings.scheduling_credit)
        self._barriers: dict[tuple[str, int], Future] = {}
        self._barrier_seq = 0
        self._finish: Future | None = None
        self._deadlines = Deadlines()
        self._handlers = {cmd.Declare: self._declare, cmd.StartPushPull: self._start_push_pull,
                          cmd.Barrier: self._barrier, cmd.GetServerState: self._get_server_state,
                          cmd.LoadServerState: self._load_server_state,
                          cmd.LoadCompressorState: self._load_compressor_state, cmd.Finish: self._finish_job}

    def submit(self, command: Any) -> None:
        """Hand ``command`` to the thread (from any thread)."""
        if self.fatal:
            raise self.fatal
        if self.stopped.is_set():
            raise JobError("gradpress was shut down on this worker")
        self._commands.put(command)
        self.wake()

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # the pipe is full: the thread is already due to wake

    # ---- the communication thread: the loop ----------------------------------

    def run(self) -> None:
        self.link = None
        servers: list[zmq.Socket] = []
        try:
            self.link = SchedulerLink(self.s, "worker", self.ctx)
            self.book = self.link.register()
            identity = self.link.sock.getsockopt(zmq.IDENTITY)
            servers = [transport.dealer(self.ctx, n.host, n.port, identity) for n in self.book.servers]
            use_shm = self.s.shm and not self.s.enable_async and shm.available()
            local = [use_shm and n.host == self.link.host for n in self.book.servers]
            self.stages = PartitionStages(self.link.name, servers, local, self.tracer)
            self.ready.set()
            self._loop(servers)
        except JobError as e:
            self._die(e)
        except BaseException as e:  # never leave callers waiting on a dead thread
            log.exception("worker communication thread failed")
            self._die(JobError(f"worker communication thread failed: {e!r}"))
        finally:
            self.ready.set()
            for sock in servers:
                sock.close()
            if self.stages is not None:
                self.stages.close()
            if self.link is not None:
                self.tracer.write(self.link.name)
                self.link.close()
            os.close(self._wake_r)

    def _loop(self, servers: list[zmq.Socket]) -> None:
        poller = zmq.Poller()
        for sock in [self.link.sock] + servers:
            poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        timeout_ms = self.s.heartbeat_interval_s * 1000 / 2
        while not self.stopped.is_set():
            ready = dict(poller.poll(timeout_ms))
            if self._wake_r in ready:
                try:
                    os.read(self._wake_r, 65536)
                except BlockingIOError:
                    pass
            while not self._commands.empty():
                command = self._commands.get_nowait()
                self._handlers[type(command)](command)
            if self.link.sock in ready:
                while self.link.sock.poll(0):
                    self._from_scheduler()
            for rank, sock in enumerate(servers):
                while sock in ready and sock.poll(0):
                    self._from_server(rank, sock)
            self._dispatch()
            self.link.tick()
            self._deadlines.expire(time.monotonic())

    def _deadline(self) -> float:
        return time.monotonic() + self.s.op_timeout_s

    # ---- commands ---------------------------------------------------------------

    def _declare(self, c: cmd.Declare) -> None:
        if c.name in self.table.tensors:
            c.future.set(self.table.tensors[c.name])
            return
        waiters = self._declaring.setdefault(c.name, [])
        waiters.append(c)
        if len(waiters) == 1:
            extra = {"compression_params": c.spec.compression_params} if c.spec else {}
            self.link.send(Op.DECLARE, name=c.name, count=c.count, dtype=c.dtype, parts=c.parts, **extra)
            self._deadlines.add_future(self._deadline() + 2, c.future, self.s.op_timeout_s)

    def _start_push_pull(self, c: cmd.StartPushPull) -> None:
        for wk in c.job.tensor.keys:
            self._queue.put(PartitionOp(c.job, wk), c.priority)

    def _barrier(self, c: cmd.Barrier) -> None:
        self._barrier_seq += 1
        self._barriers[(c.group, self._barrier_seq)] = c.future
        self.link.send(Op.BARRIER, group=c.group, seq=self._barrier_seq)

    def _get_server_state(self, c: cmd.GetServerState) -> None:
        request = StateRequest(c.future, {wk.index for wk in c.tensor.keys})
        for wk in c.tensor.keys:
            wk.state_request = request
            transport.send(self.stages.servers[wk.server], Op.STATE_GET, self.link.name, key=wk.key)
        self._deadlines.add_future(self._deadline(), c.future, self.s.op_timeout_s)

    def _load_server_state(self, c: cmd.LoadServerState) -> None:
        self.table.load_server_state(c.name, c.states)

    def _load_compressor_state(self, c: cmd.LoadCompressorState) -> None:
        self.table.load_compressor_state(c.name, c.state)

    def _finish_job(self, c: cmd.Finish) -> None:
        self._finish = c.future
        self.link.send(Op.FINISH)

    # ---- partitions through the stages ---------------------------------------

    def _dispatch(self) -> None:
        while (op := self._queue.take()) is not None:
            if op.wkey.in_flight is not None:  # its previous round is still out: wait for it
                op.wkey.held.append(op)
                self._queue.release()
                continue
            self._send(op)

    def _send(self, op: PartitionOp) -> None:
        wk = op.wkey
        self.stages.introduce(wk)
        op.round = wk.next_round
        try:
            payload = self.stages.compress(op)
        except ValueError as e:  # NaN/inf gradients: fail this push_pull; the round never went out
            self._fail_job(op, JobError(f"push_pull of tensor {op.job.tensor.name!r}: {e}"))
            self._leave_flight(op)
            return
        wk.next_round += 1
        self.stages.push(op, payload)
        self.stages.pull(op)
        wk.in_flight = op
        self._deadlines.add(self._deadline(), lambda: self._expire(op))

    def _land(self, op: PartitionOp, h: dict, frames: list) -> None:
        job = op.job
        if job.future.done():
            return  # the job already failed; its late partitions are dropped
        try:
            self.stages.land(op, h, frames)
        except (ValueError, OSError, TypeError, KeyError) as e:
            self._fail_job(op, JobError(f"push_pull of tensor {job.tensor.name!r}: bad pull reply for "
                                        f"key {op.wkey.key}: {e}"))
            return
        job.remaining -= 1
        if job.remaining == 0:
            job.future.set(job.out)

    def _leave_flight(self, op: PartitionOp) -> None:
        """The op landed or failed: free its credit (unless an ack did) and its key."""
        if not op.acked:
            self._queue.release()
        wk = op.wkey
        if wk.in_flight is op:
            wk.in_flight = None
        if wk.held:
            self._queue.put(wk.held.popleft(), priority=HELD_FIRST)

    @staticmethod
    def _fail_job(op: PartitionOp, error: JobError) -> None:
        op.job.future.fail(error)

    def _expire(self, op: PartitionOp) -> None:
        if op.wkey.in_flight is not op:
            return  # it landed in time
        self._leave_flight(op)
        self._fail_job(op, OpTimeoutError(
            f"push_pull of {op.wkey.describe()}, round {op.round}, on server {op.wkey.server}: "
            f"no reply within GRADPRESS_OP_TIMEOUT_S={self.s.op_timeout_s:g} s"))

    # ---- replies ------------------------------------------------------------------

    def _in_flight(self, h: dict) -> PartitionOp | None:
        wk = self.table.get(h.get("key"))
        op = wk.in_flight if wk is not None else None
        return op if op is not None and ("round" not in h or op.round == h["round"]) else None

    def _from_server(self, rank: int, sock: zmq.Socket) -> None:
        _, h, frames = transport.recv(sock, routed=False)
        if h is None:
            return
        op = self._in_flight(h)
        if h["op"] == Op.PUSH_ACK:
            if op is not None and not op.acked:
                op.acked = True
                self._queue.release()
        elif h["op"] == Op.PULL_REPLY:
            if op is None:
                log.warning("dropped a pull reply for key %d round %d that nothing waits for", h["key"], h["round"])
                return
            try:
                self._land(op, h, frames)
            finally:
                self._leave_flight(op)
        elif h["op"] == Op.STATE:
            self._state_arrived(h, frames)
        elif h["op"] == Op.ERROR:
            self._server_error(rank, h, op)
        else:
            log.warning("dropped unexpected %s from server %d", h["op"].name, rank)

    def _state_arrived(self, h: dict, frames: list) -> None:
        wk = self.table.get(h["key"])
        request = wk.state_request if wk is not None else None
        if request is None:
            log.warning("dropped a server state for key %d that nothing asked for", h["key"])
            return
        wk.state_request = None
        residual = np.frombuffer(frames[0].buffer, np.float32).copy() if frames else None
        request.answer(wk.index, residual, h.get("lr"))

    def _server_error(self, rank: int, h: dict, op: PartitionOp | None) -> None:
        log.error("server %d: %s", rank, h["message"])
        wk = self.table.get(h.get("key"))
        if wk is not None and wk.state_request is not None and "round" not in h:
            wk.state_request.future.fail(JobError(f"server {rank}: {h['message']}"))
            wk.state_request = None
        if op is not None:
            self._leave_flight(op)
            self._fail_job(op, JobError(f"push_pull of tensor {op.job.tensor.name!r}: server {rank}: "
                                        f"{h['message']}"))

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
            for c in self._declaring.pop(h["name"], []):
                c.future.fail(TensorMismatchError(h["message"]))
        elif op == Op.ERROR and "group" in h:
            fut = self._barriers.pop((h["group"], h.get("seq")), None)
            if fut is not None:
                fut.fail(JobError(f"barrier of group {h['group']!r}: {h['message']}"))
        elif op == Op.BARRIER_DONE:
            fut = self._barriers.pop((h["group"], h["seq"]), None)
            if fut is not None:
                fut.set()
        elif op == Op.SHUTDOWN:
            if self._finish is not None:
                self._finish.set()
            self.stopped.set()
        else:
            log.warning("dropped unexpected %s from the scheduler", op.name)

    def _declared(self, h: dict) -> None:
        waiters = self._declaring.pop(h["name"], [])
        if not waiters:
            return
        first = waiters[0]
        t = Tensor(h["name"], first.count, first.dtype, h["tensor_id"], first.parts, h["servers"], first.spec)
        try:
            self.table.add(t, len(self.stages.servers))
        except ValueError as e:
            for c in waiters:
                c.future.fail(JobError(f"tensor {t.name!r}: {e}"))
            return
        for c in waiters:
            c.future.set(t)

    def _die(self, error: JobError) -> None:
        """Record a fatal error, fail everything that waits, and make sure the process stops."""
        self.fatal = error
        self.stopped.set()
        log.error("%s", error)
        waiting = [wk.in_flight.job.future for wk in self.table.values() if wk.in_flight is not None]
        waiting += [c.future for cs in self._declaring.values() for c in cs]
        waiting += list(self._barriers.values())
        waiting += [wk.state_request.future for wk in self.table.values() if wk.state_request is not None]
        waiting += [self._finish] if self._finish else []
        while (op := self._queue.take()) is not None:
            waiting.append(op.job.future)
        while not self._commands.empty():
            future = getattr(self._commands.get_nowait(), "future", None)
            waiting += [future] if future is not None else []
        for fut in waiting:
            fut.fail(error)
        if isinstance(error, NodeLostError) and self._finish is None:
            _exit_later(self.s.heartbeat_timeout_s, error)


def _exit_later(grace_s: float, error: JobError) -> None:
    """Stop the process if the training code has not stopped by itself within ``grace_s``.

    The error is raised at the next gradpress call; this catches a training loop that is
    busy elsewhere (or swallowed the error), so a lost peer never leaves a process behind.
    """
    def stop() -> None:
        time.sleep(grace_s)
        log.critical("exiting: %s", error)
        logging.shutdown()
        os._exit(1)
    threading.Thread(target=stop, name="gp-exit-watchdog", daemon=True).start()
