"""The worker's communication thread and the thread-safe calls that feed it.

One thread owns every socket of a worker: a DEALER to the scheduler and one to
each server. Callers (the training thread, gradient hooks) enqueue commands and
wake it through a pipe; it sends partitions in priority order within the credit,
matches pull replies to what it sent, and enforces every deadline. Errors are
recorded on the handle concerned and raised where the caller waits.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque

import numpy as np
import zmq

from ..net import shm, transport
from ..compressors import build_compressor
from ..trace import Tracer, now_us
from ..config import Settings
from ..errors import JobError, NodeLostError, OpTimeoutError, TensorMismatchError
from ..compressors.warmup import warm_up
from ..net.node import AddressBook, SchedulerLink
from ..placement import make_key, partition_counts
from ..net.protocol import Op
from .future import Future
from .jobs import PartitionOp, PushPull, Tensor
from .scheduling import CreditQueue

log = logging.getLogger(__name__)


class WorkerClient:
    def __init__(self, settings: Settings):
        self.s = settings
        self.ctx = transport.context()
        self.book: AddressBook | None = None
        self.fatal: JobError | None = None
        self.bytes_pushed = 0   # payload bytes pushed (compressed size where compressed)
        self.bytes_pulled = 0
        self.tracer = Tracer(settings.trace)
        self._commands: queue.Queue = queue.Queue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._tensors: dict[str, Tensor] = {}
        self._declaring: dict[str, list[tuple[Future, tuple]]] = {}
        self._queue = CreditQueue(settings.scheduling_credit)
        self._in_flight: dict[tuple[int, int], PartitionOp] = {}
        self._rounds: dict[int, int] = {}
        self._inited: set[int] = set()
        # one round per key in flight: a server's shared result slots rely on it
        self._busy_keys: set[int] = set()
        self._held: dict[int, deque] = {}
        self._local: list[bool] = []                   # per server: same host, use shared memory
        self._push_views: dict[int, np.ndarray] = {}   # key -> our shared push segment
        self._own_segments: list[shm.Segment] = []
        self._result_segments: dict[str, shm.Segment] = {}
        self._state_requests: dict[int, tuple[int, dict, Future]] = {}  # key -> (partition, results, future)
        self._state_to_load: dict[int, tuple[np.ndarray, float | None]] = {}  # key -> sent before its next push
        self._barriers: dict[tuple[str, int], Future] = {}
        self._barrier_seq = 0
        self._finish: Future | None = None
        self._deadlines: list[tuple[float, Future]] = []
        self._thread = threading.Thread(target=self._run, name="gp-worker-comm", daemon=True)

    # ---- calls from any thread ------------------------------------------

    def start(self) -> AddressBook:
        warm_up("worker")  # before registering: compiling later would silence the heartbeats
        self._thread.start()
        self._ready.wait(self.s.connect_timeout_s + 5)
        if self.fatal:
            raise self.fatal
        if self.book is None:
            raise OpTimeoutError("worker: the communication thread did not start")
        return self.book

    @property
    def rank(self) -> int:
        return self.book.rank

    @property
    def size(self) -> int:
        return self.book.num_workers

    def declare(self, name: str, count: int, dtype: str, codec: dict | None = None) -> Tensor:
        """Declare a tensor (once per name; waits for every worker to declare it alike)."""
        t = self._tensors.get(name)
        if t is not None:
            if (t.count, t.dtype, t.codec) != (count, dtype, codec):
                raise TensorMismatchError(f"tensor {name!r} was declared with {t.count} {t.dtype} elements "
                                          f"({t.codec or 'uncompressed'}); now used with {count} {dtype} "
                                          f"({codec or 'uncompressed'})")
            return t
        if codec is not None:
            build_compressor(codec, "worker")  # a bad config fails here, in the caller, with its message
        fut = Future(f"declare tensor {name!r}")
        parts = partition_counts(count, np.dtype(dtype).itemsize, self.s.partition_bytes)
        self._submit(("declare", name, (count, dtype, parts, codec), fut))
        return fut.result(self.s.op_timeout_s + 5)

    def tensor(self, name: str) -> Tensor | None:
        """The declared tensor ``name`` (keys, partitions, compressor state), or None."""
        return self._tensors.get(name)

    def server_state(self, name: str) -> dict[int, tuple[np.ndarray | None, float | None]]:
        """The servers' error-feedback state of tensor ``name``, per partition (for checkpoints).

        Call it between steps: a key's state changes only when one of its rounds completes.
        """
        t = self._tensors.get(name)
        if t is None:
            raise ValueError(f"tensor {name!r} was never declared on this worker")
        fut = Future(f"server state of tensor {name!r}")
        self._submit(("state_get", t, fut))
        return fut.result(self.s.op_timeout_s + 5)

    def load_server_state(self, name: str, states: dict[int, tuple[np.ndarray, float | None]]) -> None:
        """Restore the servers' state of ``name`` (per partition); it reaches each server
        just before the key's next push."""
        t = self._tensors.get(name)
        if t is None:
            raise ValueError(f"tensor {name!r} was never declared on this worker")
        for i, (residual, _) in states.items():
            if not 0 <= i < len(t.parts) or residual.size != t.parts[i]:
                raise ValueError(f"tensor {name!r}: a server state for partition {i} of {residual.size} values "
                                 f"does not fit its {len(t.parts)} partition(s) {t.parts}")
        self._submit(("state_load", t, states))

    def push_pull_async(self, name: str, src, out, divisor: int, priority: int,
                        codec: dict | None = None, lr: float | None = None) -> Future:
        """Start summing ``src`` over all workers into ``out`` (divided by ``divisor``).

        ``src`` and ``out`` are 1-D contiguous arrays of the same dtype and size (they may
        be the same array; torch CUDA tensors where ``codec`` compresses on the GPU);
        neither may be touched until the returned future is done. ``codec`` is the
        tensor's compression_params, ``lr`` the learning rate for corrected error feedback.
        """
        dtype = src.dtype.name if isinstance(src, np.ndarray) else str(src.dtype).replace("torch.", "")
        tensor = self.declare(name, int(src.numel() if hasattr(src, "numel") else src.size), dtype, codec)
        fut = Future(f"push_pull of tensor {name!r}")
        job = PushPull(tensor, src, out, divisor, fut, len(tensor.parts), lr)
        self._submit(("push_pull", job, priority))
        return fut

    def barrier(self, group: str = "worker") -> None:
        fut = Future(f"barrier of group {group!r}")
        self._submit(("barrier", group, fut))
        fut.result(self.s.op_timeout_s)

    def finish(self) -> None:
        """Tell the scheduler this worker is done and wait for the job to end (deadline applies)."""
        if self._stopped.is_set():
            return
        fut = Future("shutdown (waiting for every worker to finish)")
        self._submit(("finish", fut))
        try:
            fut.result(self.s.op_timeout_s)
        finally:
            self._stopped.set()
            self._wake()
            self._thread.join(timeout=5)

    def _submit(self, command: tuple) -> None:
        if self.fatal:
            raise self.fatal
        if self._stopped.is_set():
            raise JobError("gradpress was shut down on this worker")
        self._commands.put(command)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # the pipe is full: the thread is already due to wake

    # ---- the communication thread ----------------------------------------

    def _run(self) -> None:
        self.link = None
        self.servers: list[zmq.Socket] = []
        try:
            self.link = SchedulerLink(self.s, "worker", self.ctx)
            self.book = self.link.register()
            identity = self.link.sock.getsockopt(zmq.IDENTITY)
            self.servers = [transport.dealer(self.ctx, n.host, n.port, identity) for n in self.book.servers]
            use_shm = self.s.shm and not self.s.enable_async and shm.available()
            self._local = [use_shm and n.host == self.link.host for n in self.book.servers]
            self._ready.set()
            self._loop()
        except JobError as e:
            self._die(e)
        except BaseException as e:  # never leave callers waiting on a dead thread
            log.exception("worker communication thread failed")
            self._die(JobError(f"worker communication thread failed: {e!r}"))
        finally:
            self._ready.set()
            for sock in self.servers:
                sock.close()
            for seg in self._own_segments:
                seg.unlink()  # normally the server already did, once it mapped them
            if self.link is not None:
                self.tracer.write(self.link.name)
            if self.link is not None:
                self.link.close()
            os.close(self._wake_r)

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.link.sock, zmq.POLLIN)
        for sock in self.servers:
            poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        timeout_ms = self.s.heartbeat_interval_s * 1000 / 2
        while not self._stopped.is_set():
            ready = dict(poller.poll(timeout_ms))
            if self._wake_r in ready:
                try:
                    os.read(self._wake_r, 65536)
                except BlockingIOError:
                    pass
            while not self._commands.empty():
                self._command(self._commands.get_nowait())
            if self.link.sock in ready:
                while self.link.sock.poll(0):
                    self._from_scheduler()
            for rank, sock in enumerate(self.servers):
                while sock in ready and sock.poll(0):
                    self._from_server(rank, sock)
            self._dispatch()
            self.link.tick()
            self._expire(time.monotonic())

    def _command(self, cmd: tuple) -> None:
        kind = cmd[0]
        now = time.monotonic()
        if kind == "declare":
            _, name, spec, fut = cmd
            if name in self._tensors:
                fut.set(self._tensors[name])
                return
            waiters = self._declaring.setdefault(name, [])
            waiters.append((fut, spec))
            if len(waiters) == 1:
                count, dtype, parts, codec = spec
                extra = {"codec": codec} if codec else {}
                self.link.send(Op.DECLARE, name=name, count=count, dtype=dtype, parts=parts, **extra)
                self._deadlines.append((now + self.s.op_timeout_s + 2, fut))
        elif kind == "push_pull":
            _, job, priority = cmd
            for i in range(len(job.tensor.parts)):
                self._queue.put(PartitionOp(job, i), priority)
        elif kind == "barrier":
            _, group, fut = cmd
            self._barrier_seq += 1
            self._barriers[(group, self._barrier_seq)] = fut
            self.link.send(Op.BARRIER, group=group, seq=self._barrier_seq)
        elif kind == "state_get":
            _, t, fut = cmd
            results: dict = {}
            for i in range(len(t.parts)):
                key = make_key(t.tensor_id, i)
                self._state_requests[key] = (i, results, fut)
                transport.send(self.servers[t.servers[i]], Op.STATE_GET, self.link.name, key=key)
            self._deadlines.append((now + self.s.op_timeout_s, fut))
        elif kind == "state_load":
            _, t, states = cmd
            for i, state in states.items():
                self._state_to_load[make_key(t.tensor_id, i)] = state
        elif kind == "finish":
            self._finish = cmd[1]
            self.link.send(Op.FINISH)

    def _dispatch(self) -> None:
        while (op := self._queue.take()) is not None:
            t = op.job.tensor
            op.key = make_key(t.tensor_id, op.index)
            if op.key in self._busy_keys:  # its previous round is still out: wait for it
                self._held.setdefault(op.key, deque()).append(op)
                self._queue.release()
                continue
            self._send(op)

    def _send(self, op: PartitionOp) -> None:
        t = op.job.tensor
        op.server = t.servers[op.index]
        sock, name = self.servers[op.server], self.link.name
        local = self._local[op.server] and t.compressor is None  # compressed payloads are small
        lo = t.offsets[op.index]
        chunk = op.job.src[lo:lo + t.parts[op.index]]
        n = t.parts[op.index]
        if op.key not in self._inited:
            extra = {"codec": t.codec} if t.codec else {}
            if local:
                seg = shm.Segment.create("w", op.key, n * np.dtype(t.dtype).itemsize)
                self._own_segments.append(seg)
                self._push_views[op.key] = seg.array(t.dtype, n)
                extra["shm"] = seg.name
            transport.send(sock, Op.INIT_KEY, name, key=op.key, name=t.name, count=n, dtype=t.dtype, **extra)
            self._inited.add(op.key)
        restore = self._state_to_load.pop(op.key, None)
        if restore is not None:  # a checkpointed server state goes just ahead of the push
            residual, lr = restore
            transport.send(sock, Op.STATE, self.link.name, [np.ascontiguousarray(residual, np.float32)],
                           key=op.key, **({} if lr is None else {"lr": float(lr)}))
        op.round = self._rounds.get(op.key, 0)
        self._rounds[op.key] = op.round + 1
        fields = {"key": op.key, "round": op.round, "dtype": t.dtype, "count": n}
        if op.job.lr is not None:
            fields["lr"] = float(op.job.lr)
        if t.compressor is not None:
            start = now_us()
            try:
                meta, buffers = t.compressor.compress(chunk, key=op.key, round=op.round, lr=op.job.lr)
            except ValueError as e:  # NaN/inf gradients: fail this push_pull, keep the state intact
                self._rounds[op.key] = op.round  # the round never went out
                self._done(op)
                op.job.future.fail(JobError(f"push_pull of tensor {t.name!r}: {e}"))
                return
            self.tracer.add("compress", start, now_us(), key=op.key, round=op.round)
            transport.send(sock, Op.PUSH, name, buffers, codec=t.compressor.name, meta=meta, **fields)
            self.bytes_pushed += sum(b.nbytes for b in buffers)
        elif local:
            np.copyto(self._push_views[op.key], chunk)
            transport.send(sock, Op.PUSH, name, shm=True, **fields)
            self.bytes_pushed += chunk.nbytes
        else:
            transport.send(sock, Op.PUSH, name, [chunk], **fields)
            self.bytes_pushed += chunk.nbytes
        transport.send(sock, Op.PULL, name, key=op.key, round=op.round)
        op.sent_us = now_us()
        op.deadline = time.monotonic() + self.s.op_timeout_s
        self._in_flight[(op.key, op.round)] = op
        self._busy_keys.add(op.key)

    def _done(self, op: PartitionOp) -> None:
        """The op left flight (landed or failed): free its credit (if no ack did) and its key."""
        if not op.acked:
            self._queue.release()
        self._busy_keys.discard(op.key)
        held = self._held.get(op.key)
        if held:
            self._queue.put(held.popleft(), priority=1 << 62)  # it has waited: it goes next

    def _from_server(self, rank: int, sock: zmq.Socket) -> None:
        _, h, frames = transport.recv(sock, routed=False)
        if h is None:
            return
        if h["op"] == Op.PUSH_ACK:
            op = self._in_flight.get((h["key"], h["round"]))
            if op is not None and not op.acked:
                op.acked = True
                self._queue.release()
        elif h["op"] == Op.STATE:
            request = self._state_requests.pop(h["key"], None)
            if request is None:
                log.warning("dropped a server state for key %d that nothing asked for", h["key"])
                return
            partition, results, fut = request
            residual = np.frombuffer(frames[0].buffer, np.float32).copy() if frames else None
            results[partition] = (residual, h.get("lr"))
            if not any(r[2] is fut for r in self._state_requests.values()):
                fut.set(results)
        elif h["op"] == Op.PULL_REPLY:
            op = self._in_flight.pop((h["key"], h["round"]), None)
            if op is None:
                log.warning("dropped a pull reply for key %d round %d that nothing waits for", h["key"], h["round"])
                return
            try:
                self._land(op, h, frames)
            finally:
                self._done(op)
        elif h["op"] == Op.ERROR:
            ops = [o for (k, r), o in self._in_flight.items()
                   if k == h.get("key") and ("round" not in h or r == h["round"])]
            log.error("server %d: %s", rank, h["message"])
            request = self._state_requests.pop(h.get("key"), None) if "round" not in h else None
            if request is not None:
                request[2].fail(JobError(f"server {rank}: {h['message']}"))
            for o in ops:
                del self._in_flight[(o.key, o.round)]
                self._done(o)
                o.job.future.fail(JobError(f"push_pull of tensor {o.job.tensor.name!r}: server {rank}: {h['message']}"))
        else:
            log.warning("dropped unexpected %s from server %d", h["op"].name, rank)

    def _land(self, op: PartitionOp, h: dict, frames: list) -> None:
        job, t = op.job, op.job.tensor
        n = t.parts[op.index]
        self.tracer.add("push to reply", op.sent_us, now_us(), key=op.key, round=op.round)
        if job.future.done():
            return  # the job already failed; its late partitions are dropped
        lo = t.offsets[op.index]
        dst = job.out[lo:lo + n]
        start = now_us()
        try:
            if h["dtype"] != t.dtype or h["count"] != n:
                raise ValueError(f"{h['count']} {h['dtype']} elements, expected {n} {t.dtype}")
            if t.compressor is not None:
                if h.get("codec") != t.compressor.name or "meta" not in h:
                    raise ValueError(f"encoded as {h.get('codec', 'raw values')!r}, expected {t.compressor.name!r}")
                t.compressor.decompress(h["meta"], [f.buffer for f in frames], dst, key=op.key, round=op.round)
                if job.divisor != 1:
                    dst /= job.divisor
            else:
                summed = self._shared_result(h, n, t.dtype) if "shm" in h else self._frame_result(frames, n, t.dtype)
                if job.divisor != 1:
                    np.divide(summed, job.divisor, out=dst)  # average while copying: one pass
                else:
                    np.copyto(dst, summed)
        except (ValueError, OSError, TypeError, KeyError) as e:
            job.future.fail(JobError(f"push_pull of tensor {t.name!r}: bad pull reply for key {op.key}: {e}"))
            return
        if t.compressor is not None:
            self.tracer.add("decompress", start, now_us(), key=op.key, round=op.round)
        self.bytes_pulled += sum(len(f.buffer) for f in frames)
        job.remaining -= 1
        if job.remaining == 0:
            job.future.set(job.out)

    @staticmethod
    def _frame_result(frames: list, n: int, dtype: str) -> np.ndarray:
        if len(frames) != 1 or len(frames[0].buffer) != n * np.dtype(dtype).itemsize:
            raise ValueError(f"expected one frame of {n} {dtype} elements")
        return np.frombuffer(frames[0].buffer, dtype=dtype)

    def _shared_result(self, h: dict, n: int, dtype: str) -> np.ndarray:
        nbytes = n * np.dtype(dtype).itemsize
        if h.get("slot") not in (0, 1):
            raise ValueError(f"result slot {h.get('slot')!r} is not 0 or 1")
        seg = self._result_segments.get(h["shm"])
        if seg is None:
            seg = self._result_segments[h["shm"]] = shm.Segment(h["shm"], 2 * nbytes, create=False)
        return seg.array(dtype, n, offset=h["slot"] * nbytes)

    def _from_scheduler(self) -> None:
        _, h, _ = transport.recv(self.link.sock, routed=False)
        if h is None:
            return
        h = self.link.handle(h)
        if h is None:
            return
        op = h["op"]
        if op == Op.DECLARED:
            waiters = self._declaring.pop(h["name"], [])
            if not waiters:
                return
            count, dtype, parts, codec = waiters[0][1]
            t = Tensor(h["name"], count, dtype, h["tensor_id"], parts, h["servers"], codec)
            self._tensors[t.name] = t
            for fut, _ in waiters:
                fut.set(t)
        elif op == Op.ERROR and "name" in h:
            for fut, _ in self._declaring.pop(h["name"], []):
                fut.fail(TensorMismatchError(h["message"]))
        elif op == Op.BARRIER_DONE:
            fut = self._barriers.pop((h["group"], h["seq"]), None)
            if fut is not None:
                fut.set()
        elif op == Op.SHUTDOWN:
            if self._finish is not None:
                self._finish.set()
            self._stopped.set()
        else:
            log.warning("dropped unexpected %s from the scheduler", op.name)

    def _expire(self, now: float) -> None:
        for (key, rnd), op in list(self._in_flight.items()):
            if now > op.deadline:
                del self._in_flight[(key, rnd)]
                self._done(op)
                op.job.future.fail(OpTimeoutError(
                    f"push_pull of tensor {op.job.tensor.name!r}: partition {op.index} (key {key}, round {rnd}) "
                    f"on server {op.server}: no reply within GRADPRESS_OP_TIMEOUT_S={self.s.op_timeout_s:g} s"))
        self._deadlines = [(d, f) for d, f in self._deadlines if not f.done()]
        for d, fut in self._deadlines:
            if now > d:
                fut.fail(OpTimeoutError(f"{fut.what}: no answer within {self.s.op_timeout_s:g} s"))

    def _die(self, error: JobError) -> None:
        """Record a fatal error, fail everything that waits, and make sure the process stops."""
        self.fatal = error
        self._stopped.set()
        log.error("%s", error)
        waiting = [op.job.future for op in self._in_flight.values()]
        waiting += [f for fs in self._declaring.values() for f, _ in fs]
        waiting += list(self._barriers.values()) + [f for _, f in self._deadlines]
        waiting += [self._finish] if self._finish else []
        while (op := self._queue.take()) is not None:
            waiting.append(op.job.future)
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
