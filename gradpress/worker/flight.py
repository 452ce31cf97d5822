"""Partitions in flight on a worker: credit, rounds, replies and their deadlines.

``PartitionFlight`` takes partitions in priority order within the credit, keeps one
round per key on the wire (later rounds wait behind it), runs each partition through
its stages, and routes each server reply to the key it belongs to. It runs on the
communication thread, which owns the sockets.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import zmq

from .. import logs
from ..compressors.arrays import is_device_array
from ..config import Settings
from ..errors import JobError, NonFiniteInput, OpTimeoutError
from ..net import transport
from ..net.protocol import MAX_REASON_CHARS, Op
from .deadlines import Deadlines
from . import device_encode, grouped, nonfinite
from .future import Future
from .jobs import PartitionOp, PushPull
from .keys import KeyTable, WorkerKey
from .relay import Relay
from .scheduling import CreditQueue
from .stages import PartitionStages, Payload

log = logging.getLogger(__name__)
HELD_FIRST = 1 << 62  # a partition that waited for its key's previous round goes next


class PartitionFlight:
    def __init__(self, settings: Settings, stages: PartitionStages, table: KeyTable, deadlines: Deadlines):
        self.s = settings
        self.stages = stages
        self.table = table
        self._deadlines = deadlines
        self._queue = CreditQueue(settings.scheduling_credit)
        self.relay: Relay | None = None   # set where this worker owns keys of a local group
        self.left: dict[int, str] = {}    # its workers that finished while the job goes on: why (Op.LEFT)
        self.describe: Callable[[int], str] = lambda endpoint: f"server {endpoint}"
        self._log_error = logs.Throttled(log, logging.ERROR, 10.0)  # (a line each key's would flood the log)
        self._log_stalled = logs.Throttled(log, logging.WARNING, settings.op_timeout_s / 2)

    def start(self, job: PushPull, priority: int) -> None:
        for wk in job.tensor.keys:
            self._queue.put(PartitionOp(job, wk), priority)

    def waiting(self) -> list[Future]:
        """The futures of every push_pull queued (whatever the credit), held behind its key's
        round or in flight, taking the queued ones (to fail them all when the job ends)."""
        ops = [wk.in_flight for wk in self.table.values() if wk.in_flight is not None]
        ops += [op for wk in self.table.values() for op in wk.held] + self._queue.drain()
        return [op.job.future for op in ops]

    def busy(self, names: list[str]) -> list[str]:
        """Those of tensors ``names`` with a partition queued, waiting for its key or in flight."""
        queued = {op.job.tensor.name for op in self._queue.waiting()}
        tensors = [self.table.tensors[n] for n in names if n in self.table.tensors]
        return [t.name for t in tensors
                if t.name in queued or any(wk.in_flight is not None or wk.held for wk in t.keys)]

    def dispatch(self) -> None:
        while (op := self._queue.take()) is not None:
            wk = op.wkey
            # its previous round is still out, or another job holds its next payload: wait
            if wk.in_flight is not None or (wk.compressed_by is not None and wk.compressed_by is not op.job):
                wk.held.append(op)
                self._queue.release()
                continue
            self._send(op)

    def _send(self, op: PartitionOp) -> None:
        wk = op.wkey
        self.stages.introduce(wk, op.job.src)
        op.round = wk.next_round
        relayed = wk.pushers and self.relay is not None
        if self.left and (why := self.relay.waits_on(op, self.left)):  # it needs a local worker that left
            wk.next_round, wk.in_flight = wk.next_round + 1, op
            return self._expire(op, why)
        if op.job.future.done():  # failed meanwhile: the caller may reuse its tensors (an owner's peers hear it)
            self._refuse_unread(op)
            return
        filling = op.job.filling()
        if filling is None:
            self.stages.await_source(op.job)
        if relayed:  # ours to sum for the machine: the peers' pushes first
            wk.next_round += 1
            wk.in_flight = op
            op.deadline = self._deadlines.add(time.monotonic() + self.s.op_timeout_s, lambda: self._expire(op))
            op.acked = True  # taken, as a server's ack takes a push: credit must not wait for the peers
            self._queue.release()
            self.relay.contribute(op, filling)
            return
        rounds = grouped.take_rounds(op, self.s.group_partitions, self.stages)
        wk.next_round += 1
        wk.in_flight = op  # (before the send: a push waiting for its copy checks it is still wanted)
        op.deadline = self._deadlines.add(time.monotonic() + self.s.op_timeout_s, lambda: self._expire(op))
        if filling is not None:  # its source is still being copied off the GPU: waited for off this thread
            self.stages.host_copies.after(filling, lambda: self._filled(op), what=op.wkey.describe)
            return
        if self.stages.encodes_on_device(op):  # launches and a wait for the payload: off this thread
            self.stages.host_copies.run(lambda: device_encode.encode(self.stages, op, rounds),
                                        lambda made: self._encoded(op, made))
            return
        if rounds is not None:
            self.stages.compress_tensor(op.job, rounds)
        self.stages.send(op, self._payload(op))

    def _refuse_unread(self, op: PartitionOp) -> None:
        """A partition of a push_pull that failed before it went: its round goes out refused,
        its source never read again (the caller, told, may have freed or rewritten it)."""
        wk = op.wkey
        wk.next_round += 1
        wk.in_flight = op
        op.deadline = self._deadlines.add(time.monotonic() + self.s.op_timeout_s, lambda: self._expire(op))
        self._unmark(op)  # a grouped encode's payload for it is never taken: its mark must go here
        self.stages.send(op, PartitionStages.refusal(f"its push_pull of tensor {op.job.tensor.name!r} failed "
                                                     "before this partition went"))

    def _unmark(self, op: PartitionOp) -> None:
        for held in grouped.unmark(op):
            self._queue.put(held, priority=HELD_FIRST)

    def _encoded(self, op: PartitionOp, made: Payload | ValueError | None) -> None:
        """Back on this thread: push ``op``'s payload, unless its round failed meanwhile."""
        if isinstance(made, ValueError) or op.wkey.in_flight is not op:  # later jobs may wait on its marks
            self._unmark(op)
        if op.wkey.in_flight is not op:
            return  # failed meanwhile (its deadline passed): the round never goes out
        self.stages.send(op, self._refused(op, made) if isinstance(made, ValueError) else made)

    def _filled(self, op: PartitionOp) -> None:
        """``op``'s source has been copied into: compress and push it, unless its round failed
        meanwhile. (A staged source's partitions are never compressed together.)"""
        if op.wkey.in_flight is not op:
            return  # failed meanwhile (its deadline passed): the round never goes out
        self.stages.await_source(op.job)  # (done: no wait)
        self.stages.send(op, self._payload(op))

    def peer_left(self, rank: int, why: str) -> None:
        """A local worker finished while the job goes on (LEFT): rounds that wait on it (its push;
        its sum as a key's owner) fail, naming it; later ones as they go."""
        self.left[rank] = why
        for wk in self.table.values():
            if (op := wk.in_flight) is not None and (why := self.relay.waits_on(op, self.left)):
                self._deadlines.add(time.monotonic() + (wk.via is not None), lambda o=op, w=why: self._owner_gone(o, w))

    def _owner_gone(self, op: PartitionOp, why: str) -> None:
        """(Its sum of a round it completed, sent before its LEFT on another socket, is read first.)"""
        if op.wkey.via is not None:
            sock = self.stages.servers[op.wkey.via]
            while op.wkey.in_flight is op and sock.poll(0):
                self.from_server(op.wkey.via, sock)
        self._expire(op, why)

    def push_summed(self, op: PartitionOp) -> None:
        """The machine's sum of an owned key's round is in ``op.summed``: compress, push, pull."""
        self.stages.send(op, self._payload(op))

    def _payload(self, op: PartitionOp) -> Payload | None:
        """``op``'s compressed payload (None: raw values), or its round's refusal (``_refused``),
        which goes out too and stays in flight until the reply (a machine's peers: relayed)."""
        try:
            return self.stages.compress(op)
        except ValueError as e:
            return self._refused(op, e)

    def _refused(self, op: PartitionOp, error: ValueError) -> Payload:
        """``op``'s codec refused its round: for NaN/inf, it goes out ``nonfinite`` and every
        worker lands NaN (nonfinite.py); else its job fails now, and it goes out refused."""
        if isinstance(error, NonFiniteInput):
            return nonfinite.push(error)
        op.job.future.fail(JobError(f"push_pull of tensor {op.job.tensor.name!r}: {error}"))
        return PartitionStages.refusal(str(error))

    def fail_local(self, op: PartitionOp, message: str) -> None:
        """An owned key's round failed before it reached the server: its job and the waiting peers
        fail, and the server's round ends refused for every machine. It stays in flight until the
        server's answer, so the key's next round cannot reach the server before this one ended."""
        self.relay.fail(op.wkey.key, op.round, message)
        self.stages.send(op, PartitionStages.refusal(message))
        op.job.future.fail(JobError(message))

    def _land(self, op: PartitionOp, h: dict, frames: list) -> None:
        job = op.job
        if job.future.done():  # the job already failed: its late partitions are dropped, but a
            return nonfinite.restart(op, h)  # skipped round restarts the key's state all the same
        try:
            self.stages.land(op, h, frames)
        except Exception as e:  # a bad reply, or the device's error (out of memory, CUDA): this job fails
            what = "bad pull reply" if isinstance(e, (ValueError, OSError, TypeError, KeyError)) else "landing failed"
            op.job.future.fail(JobError(f"push_pull of tensor {job.tensor.name!r}: {what} for key {op.wkey.key} "
                                        f"(from {self.describe(self.stages.endpoint(op.wkey))}): {e}"))
            return
        job.remaining -= 1
        if job.remaining == 0:
            if is_device_array(job.out):  # the consumer's stream waits for this, not the host
                from ..kernels.cuda import device
                job.future.device_event = device.finished(job.out)
            job.future.set(job.out)

    def _leave_flight(self, op: PartitionOp) -> None:
        """The op landed or failed: free its credit (unless an ack did) and its key."""
        if not op.acked:
            self._queue.release()
        if op.deadline is not None:  # it holds the op (the gradient, the output) until cancelled
            self._deadlines.cancel(op.deadline)
            op.deadline = None
        wk = op.wkey
        if wk.in_flight is op:
            wk.in_flight = None
        if wk.held:
            self._queue.put(wk.held.popleft(), priority=HELD_FIRST)

    def _expire(self, op: PartitionOp, why: str = "") -> None:
        """``op``'s deadline passed, or (``why``) a local worker it waits on left the job."""
        if op.wkey.in_flight is not op:
            return  # it landed in time
        message = f"push_pull of {op.wkey.describe()}, round {op.round}: {why}" if why else self._overdue(op)
        if op.wkey.pushers and self.relay is not None:
            self.relay.fail(op.wkey.key, op.round, message)
        if not op.sent_us and op.wkey.via is None:  # the server's round still ends, for every worker (every
            self.stages.send(op, PartitionStages.refusal(message))  # machine): the payload, the sum, never sent
        self._leave_flight(op)
        op.job.future.fail(JobError(message) if why else OpTimeoutError(message))

    def _overdue(self, op: PartitionOp) -> str:
        if missing := (self.relay.waiting_for(op) if self.relay is not None and op.wkey.pushers else []):
            where = f"waiting for the local push of worker(s) {missing}"
        elif not op.sent_us:  # with the host-copies thread: a GPU copy or encoder hangs (an owner's too)
            where = "never sent: its copy off the GPU, or its encoder there, did not finish"
        else:
            where = f"on {self.describe(self.stages.endpoint(op.wkey))}"
        return (f"push_pull of {op.wkey.describe()}, round {op.round}, {where}: "
                f"no reply within GRADPRESS_OP_TIMEOUT_S={self.s.op_timeout_s:g} s"
                + (f"; {op.stalled}" if op.stalled else ""))  # a server's STALLED: whose push it waits for

    # ---- replies ----------------------------------------------------------------

    @staticmethod
    def _in_flight(wk: WorkerKey | None, h: dict) -> PartitionOp | None:
        op = wk.in_flight if wk is not None else None
        return op if op is not None and ("round" not in h or op.round == h["round"]) else None

    def from_server(self, rank: int, sock: zmq.Socket) -> None:
        _, h, frames = transport.recv(sock, routed=False)
        if h is None:
            return
        wk = self.table.get(h.get("key"))
        if wk is not None and not wk.answers_from(h["op"], rank):  # a buggy peer's would land as its sum
            log.warning("dropped %s for key %d from %s: %s answers it", h["op"].name, wk.key, self.describe(rank),
                        self.describe(wk.server if h["op"] == Op.STATE else wk.endpoint))
            return
        op = self._in_flight(wk, h)
        if h["op"] == Op.PUSH_ACK:
            if op is not None and not op.acked:
                op.acked = True
                self._queue.release()
        elif h["op"] == Op.PULL_REPLY:
            if op is None:
                log.warning("dropped a pull reply for key %d round %d that nothing waits for", h["key"], h["round"])
                return
            if op.wkey.pushers and self.relay is not None:  # the machine's result: the peers land it too
                self.relay.relay(op.wkey.key, op.round, Op.PULL_REPLY, h, frames)
            try:
                self._land(op, h, frames)
            finally:
                self._leave_flight(op)
        elif h["op"] == Op.STATE:
            if wk is None or not wk.take_state(frames, h.get("lr"), self.describe(wk.server)):
                log.warning("dropped a server state for key %d that nothing asked for", h["key"])
        elif h["op"] == Op.ERROR:
            self._server_error(rank, h, wk, op)
        elif h["op"] == Op.STALLED:
            if op is not None:  # (the latest: one that pushed the next round early hears of this one's too)
                op.stalled = logs.peer(h["message"], MAX_REASON_CHARS)
                if op.wkey.pushers and self.relay is not None:  # the machine's workers waiting hear it too
                    self.relay.tell(op.wkey.key, op.round, Op.STALLED, h)
                self._log_stalled(rank, "push_pull of %s, round %d: %s; it fails at GRADPRESS_OP_TIMEOUT_S=%g s unless "
                                  "that push comes", op.wkey.describe(), op.round, op.stalled, self.s.op_timeout_s)
        else:
            log.warning("dropped unexpected %s from server %d", h["op"].name, rank)

    def _server_error(self, rank: int, h: dict, wk: WorkerKey | None, op: PartitionOp | None) -> None:
        who = self.describe(rank)
        self._log_error(who, "%s: %s", who, logs.peer(h["message"], MAX_REASON_CHARS))
        if wk is not None and wk.state_request is not None and "round" not in h:
            wk.state_request.future.fail(JobError(f"{who}: {h['message']}"))
            wk.state_request = None
        if op is not None:
            if op.wkey.pushers and self.relay is not None:
                self.relay.fail(op.wkey.key, op.round, f"{who}: {h['message']}")
            self._leave_flight(op)
            op.job.future.fail(JobError(f"push_pull of tensor {op.job.tensor.name!r}: {who}: "
                                        f"{h['message']}"))

