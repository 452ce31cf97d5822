"""Engine threads: each owns a set of keys and does their numeric work.

A key is pinned to one engine for its lifetime, so its state needs no lock. The I/O thread
hands work over a queue; an engine sends its replies back over its own inproc socket (one
socket per thread), and the I/O thread forwards them. A failed engine says so in an ERROR
on a second inproc socket, the I/O thread's report channel, so that the server stops with
that error instead of leaving workers waiting. An engine owns the shared-memory result
slots it makes for co-located workers, and its mappings of their push areas.

One more Engine is never started: the I/O thread calls :meth:`Engine.serve` itself for
the keys of at most INLINE_MAX_BYTES, and for every key where there are no engine threads
(:func:`engine_count` 0). A hand-off costs the server about 80 us of CPU (queue, wake-up,
an inproc message and its forwarding: docs/history/performance-2026.md), more than a small key's whole
sum, and engine threads pay only where they run beside the I/O thread on cores of their own.
"""
from __future__ import annotations

import logging
import queue
import threading
import time

import numpy as np
import zmq

from .. import host, logs
from ..errors import JobError, Terminated
from ..net import transport
from ..net.guard import PeerGuard
from ..net.node import AddressBook
from ..net.protocol import Op
from ..net.shm import Arena, PeerChunks
from ..trace import Tracer
from . import sparse
from .sink import Reply, SharedSlots
from .store import KeyState, PushError, Refused
from .waits import RoundWaits, in_round

log = logging.getLogger(__name__)
STOP = object()
CHECK_WAITS = object()  # an engine thread's turn to look for rounds held up by a worker (waits.py)
# engine threads where the setting leaves it to the host (BYTEPS_SERVER_ENGINE_THREAD=-1)
DEFAULT_ENGINE_THREADS = 2
# keys this small are summed on the I/O thread even beside engine threads: their work, a few
# microseconds a push, is far below what handing them over costs
INLINE_MAX_BYTES = 65536


def refused_push(header: dict, frames: list, state) -> Refused:
    """A push whose worker's codec refused the round, or met NaN/inf in it (``nonfinite``, for
    a compressed key only: an uncompressed one sums them) (store.py): no data, only why."""
    overflow = "nonfinite" in header
    if frames or not isinstance(state, KeyState) or (header["dtype"], header["count"]) != (state.dtype, state.count) \
            or (overflow and (state.compressor is None or "refused" in header)):
        kind = "nonfinite" if overflow else "refused"
        raise PushError(f"key {header['key']}: a {kind} push must carry no data, for a dense "
                        f"{'compressed ' if overflow else ''}key of its {header['count']} {header['dtype']} elements")
    why = header["nonfinite"] if overflow else header["refused"]
    return Refused(f"{logs.peer(header['from'])} ({logs.peer(why, logs.REASON_CHARS)})", overflow)


def engine_count(setting: int, cores: float, sharing: int) -> int:
    """A server's engine threads: ``setting`` where it is one (>= 0); else 2, or 0 where the
    server's share of its host's ``cores`` (split among the ``sharing`` workers and servers
    there, itself included) is under 2: its engines would then take turns on the I/O
    thread's core instead of running beside it, and each hand-off costs CPU for nothing."""
    if setting >= 0:
        return setting
    return DEFAULT_ENGINE_THREADS if cores / max(sharing, 1) >= 2 else 0


def local_engine_count(setting: int, book: AddressBook) -> int:
    """:func:`engine_count` for a server on this process's machine: its cores, and who shares
    them by the address book's machine ids (the server itself, and the planner on rank 0)."""
    return engine_count(setting, host.cores(), len(book.sharing(host.machine_id())))


class Engine(threading.Thread):
    def __init__(self, index: int, ctx: zmq.Context, reply_addr: str, report_addr: str, sender_name: str,
                 num_workers: int, async_mode: bool, tracer: Tracer, stalled_after_s: float = float("inf")):
        super().__init__(name=f"gp-engine-{index}", daemon=True)
        self.index = index
        # refusals are logged once per sender and counted after (its budget is never used here)
        self.drops = PeerGuard(f"engine {index}", rate_per_s=1.0, burst=1)
        self.inbox: queue.Queue = queue.Queue()
        self.keys: dict[int, KeyState] = {}
        self.load_bytes = 0
        self._ctx = ctx
        self._reply_addr = reply_addr
        self._report_addr = report_addr
        self._sender_name = sender_name
        self._num_workers = num_workers
        self._async = async_mode
        self._tracer = tracer
        self.failure: BaseException | None = None
        self.left = ""  # why no round can complete any more (a worker finished early: Op.LEFT)
        self.waits = RoundWaits(sender_name, num_workers, stalled_after_s)
        self.push_views: dict[tuple[bytes, int], np.ndarray] = {}  # co-located workers' pushes
        self.peer_chunks = PeerChunks()    # co-located workers' push areas, mapped
        self.results = Arena("s")           # result slots of keys with co-located workers
        # the same for keys whose co-located workers are GPU workers: they register the slots
        # with the CUDA driver (DMA to the device), so released pages are never punched
        self.dma_results = Arena("s", punch=False)

    def run(self) -> None:
        out = self._ctx.socket(zmq.PUSH)
        out.setsockopt(zmq.LINGER, 0)
        out.connect(self._reply_addr)
        try:
            while True:
                item = self.inbox.get()
                if item is STOP:
                    return
                for reply in self.check_waits() if item is CHECK_WAITS else self._handle(*item):
                    transport.send(out, reply.op, self._sender_name, reply.buffers, identity=reply.to,
                                   **reply.fields)
                self.drops.report()
        except BaseException as e:  # a bug here must stop the server, not hang its workers
            log.exception("engine %d failed", self.index)
            self.failure = e
            self._report(f"engine thread {self.index} failed: {type(e).__name__}: {e}")
        finally:
            out.close()
            self.close()

    def serve(self, identity: bytes, header: dict, frames: list) -> list[Reply]:
        """The replies to one message, worked out on the calling thread (the I/O thread, for
        its own keys). Raises JobError where the work itself failed: a bug that must stop
        the server, as a failed engine thread's report does."""
        try:
            replies = self._handle(identity, header, frames)
        except Terminated:
            raise
        except Exception as e:
            log.exception("the I/O thread's engine failed")
            self.failure = e
            raise JobError(f"{self._sender_name}: the I/O thread's engine failed: {type(e).__name__}: {e}") from e
        self.drops.report()
        return replies

    def check_waits(self) -> list[Reply]:
        """STALLED for the rounds a worker holds up (none in async jobs, or once a worker left)."""
        return [] if self._async or self.left else self.waits.check(self.keys, time.monotonic())

    def close(self) -> None:
        """Give back the shared-memory result slots (the engine serves no more)."""
        self.results.close()
        self.dma_results.close()

    def _report(self, message: str) -> None:
        """Tell the I/O thread (not a worker) that this engine can serve no more."""
        report = self._ctx.socket(zmq.PUSH)
        report.setsockopt(zmq.LINGER, 1000)  # deliver it even though the socket closes at once
        try:
            report.connect(self._report_addr)
            transport.send(report, Op.ERROR, self._sender_name, message=message)
        except zmq.ZMQError as e:
            log.error("engine %d could not report its failure: %s", self.index, e)
        finally:
            report.close()

    def _handle(self, identity: bytes, header: dict, frames: list) -> list[Reply]:
        op = header["op"]
        if op == Op.LEFT:  # (async jobs: workers end when they will; pushes are applied alone)
            if self._async:
                return []
            self.left = self.left or header["reason"]
            return self.waits.left(self.keys, self.left)
        try:
            if op == Op.INIT_KEY:
                return self._init_key(identity, header)
            if op == Op.RELEASE:
                self._release(header["key"])
                return []
            state = self.keys.get(header["key"])
            if state is None:
                raise PushError(f"key {header['key']}: not held here (its INIT_KEY was refused, or it was "
                                f"released), so it takes no pushes or pulls")
            if getattr(state, "broken", ""):
                raise PushError(state.broken)
            if op == Op.STATE_GET:
                residual, lr = state.server_state()
                fields = {"key": header["key"]} if lr is None else {"key": header["key"], "lr": lr}
                return [Reply(identity, Op.STATE, fields, [] if residual is None else [residual])]
            if op == Op.STATE:
                if len(frames) != 1:
                    raise PushError(f"{state.describe()}: a state to restore carries {len(frames)} frames, expected 1")
                buf = frames[0].buffer if hasattr(frames[0], "buffer") else frames[0]
                if len(buf) % 4:
                    raise PushError(f"{state.describe()}: a restored residual of {len(buf)} bytes")
                state.load_server_state(np.frombuffer(buf, np.float32), header.get("lr"))
                return []
            if self.left and op in (Op.PUSH, Op.PULL) and header["round"] != getattr(state, "done_round", None):
                raise PushError(f"{state.describe()}, round {header['round']}: {self.left}")
            if op == Op.PUSH:
                if header.get("pull") and not state.pullable(header["round"]):  # refused before it is kept
                    raise PushError(f"{state.describe()}: a push of round {header['round']} asks for that round's "
                                    f"pull, but the key is at round {state.round}")
                values = refused_push(header, frames, state) if "refused" in header or "nonfinite" in header \
                    else self._shared_push(identity, header, state) if header.get("shm") \
                    else state.decode(header, frames)
                replies = state.push(identity, header["round"], values, header.get("lr"))
                # the ack frees the worker's credit now, not when every worker has pushed:
                # credit held until then deadlocks workers that start keys in different orders
                ack = Reply(identity, Op.PUSH_ACK, {"key": header["key"], "round": header["round"]}, [])
                if header.get("pull"):  # and its PULL, as if it came next
                    return [ack] + replies + state.pull(identity, header["round"])
                return [ack] + replies
            return state.pull(identity, header["round"])
        except PushError as e:
            self.drops.dropped(identity, f"dropped {op.name}: {e}", logs.peer(header["from"]))
            fields = {"message": str(e), "key": header["key"]}
            if "round" in header:
                fields["round"] = header["round"]
            return [Reply(identity, Op.ERROR, fields, [])]
        except Terminated:
            raise
        except Exception as e:  # a bug in this key's work: its round fails, the server serves on
            return self._break_key(identity, header, e)

    def _break_key(self, identity: bytes, header: dict, error: Exception) -> list[Reply]:
        """An unexpected exception in ``header``'s work: the key's sums can no longer be
        trusted, so every worker in its round (the sender, those that pushed or wait to pull)
        gets an ERROR naming this server, the key and the exception, and every later message
        for the key gets the same; the other keys are untouched."""
        key = header.get("key")
        state = self.keys.get(key)
        where = f"tensor {state.name!r}, key {key}" if state is not None else f"key {key}"
        message = (f"{self._sender_name}: {where}: {type(error).__name__}: {error} (an internal error in its "
                   f"{header['op'].name}; the key takes no more rounds)")
        log.error("%s", message, exc_info=error)
        rounds = {identity: header.get("round")}  # each worker's round in flight on this key
        if state is not None:
            state.broken = message
            for to, rnd in in_round(state):
                rounds.setdefault(to, rnd)
        return [Reply(to, Op.ERROR, {"message": message, "key": key, **({} if rnd is None else {"round": rnd})}, [])
                for to, rnd in sorted(rounds.items())]

    def _init_key(self, identity: bytes, h: dict) -> list[Reply]:
        self.waits.met(identity, h["from"])
        state = self.keys.get(h["key"])
        if "sparse" in h or isinstance(state, sparse.SparseKeyState):  # a row-sparse tensor's share
            return sparse.init_key(self.keys, h, self._num_workers, self._async, self._tracer)
        pushers = h.get("pushers", self._num_workers)  # one per machine where workers reduce locally
        if not 1 <= pushers <= self._num_workers:
            raise PushError(f"key {h['key']}: INIT_KEY expects {pushers} pushes a round; the job has "
                            f"{self._num_workers} worker(s)")
        if state is None:
            state = self.keys[h["key"]] = KeyState(h["key"], h["name"], h["count"], h["dtype"], pushers,
                                                   self._async, h.get("compression_params"), self._tracer)
        else:
            state.check_init(h["name"], h["count"], h["dtype"], h.get("compression_params"))
            if pushers != state.num_workers:
                raise PushError(f"{state.describe()}: INIT_KEY expects {pushers} pushes a round; another "
                                f"said {state.num_workers} (do the workers agree on GRADPRESS_LOCAL_REDUCE?)")
        if "shm" in h:
            self._attach(identity, h, state)
        return []

    def _release(self, key: int) -> None:
        """Forget ``key``: its sums, residual, co-located workers' push views, and its shared
        result slots (every worker has pulled its last round: they go back to the arena)."""
        state = self.keys.pop(key, None)
        self.waits.forget(key)
        if isinstance(getattr(state, "sink", None), SharedSlots):
            (self.dma_results if state.sink.dma else self.results).free(state.sink.region)
        for view in [v for v in self.push_views if v[1] == key]:
            del self.push_views[view]

    def _attach(self, identity: bytes, h: dict, state: KeyState) -> None:
        """Map a co-located worker's push segment, and share results through a segment of ours."""
        if self._async:
            raise PushError(f"{state.describe()}: shared memory is not used in async mode")
        if state.compressor is not None:  # (refused before anything is mapped or allocated)
            raise PushError(f"{state.describe()}: compressed keys travel in frames, not shared memory")
        nbytes = state.count * np.dtype(state.dtype).itemsize  # check_init made sure h agrees
        try:
            region = self.peer_chunks.region(h["shm"], nbytes)
        except OSError as e:
            raise PushError(f"{state.describe()}: cannot map the worker's shared memory ({e}); set "
                            f"GRADPRESS_SHM=0 where workers and servers do not see each other's /proc") from None
        except ValueError as e:  # not a sealed chunk of ours, or a region outside it: refused
            raise PushError(f"{state.describe()}: refused the worker's shared memory: {e}") from None
        self.push_views[(identity, h["key"])] = region.array(state.dtype, state.count)
        if not isinstance(state.sink, SharedSlots):
            dma = h.get("dma") is True
            arena = self.dma_results if dma else self.results
            state.share_results(SharedSlots(h["key"], state.count, state.dtype, arena.alloc(2 * nbytes), dma))
        state.sink.readers.add(identity)

    def _shared_push(self, identity: bytes, h: dict, state: KeyState) -> np.ndarray:
        view = self.push_views.get((identity, h["key"]))
        if view is None:
            raise PushError(f"{state.describe()}: a shared-memory push, but this worker named no segment")
        if (h["dtype"], h["count"]) != (state.dtype, state.count):
            raise PushError(f"{state.describe()}: push of {h['count']} {h['dtype']} elements; "
                            f"the key holds {state.count} {state.dtype}")
        return view
