"""Engine threads: each owns a set of keys and does their numeric work.

A key is pinned to one engine for its lifetime, so its state needs no lock. The
I/O thread hands work over a queue; an engine sends its replies back over its own
inproc socket (one socket per thread), and the I/O thread forwards them.
"""
from __future__ import annotations

import logging
import queue
import threading

import zmq

from .. import protocol
from ..protocol import Op
from .store import KeyState, PushError, Reply

log = logging.getLogger(__name__)
STOP = object()


class Engine(threading.Thread):
    def __init__(self, index: int, ctx: zmq.Context, reply_addr: str, sender_name: str,
                 num_workers: int, async_mode: bool):
        super().__init__(name=f"gp-engine-{index}", daemon=True)
        self.index = index
        self.inbox: queue.Queue = queue.Queue()
        self.keys: dict[int, KeyState] = {}
        self.load_bytes = 0
        self._ctx = ctx
        self._reply_addr = reply_addr
        self._sender_name = sender_name
        self._num_workers = num_workers
        self._async = async_mode
        self.failure: BaseException | None = None

    def run(self) -> None:
        out = self._ctx.socket(zmq.PUSH)
        out.setsockopt(zmq.LINGER, 0)
        out.connect(self._reply_addr)
        try:
            while True:
                item = self.inbox.get()
                if item is STOP:
                    return
                for reply in self._handle(*item):
                    frames = [reply.to, protocol.encode(reply.op, self._sender_name, **reply.fields)]
                    out.send_multipart(frames + list(reply.buffers), copy=False)
        except BaseException as e:  # a bug here must stop the server, not hang its workers
            log.exception("engine %d failed", self.index)
            self.failure = e
            out.send_multipart([b"", b"engine-failed"])
        finally:
            out.close()

    def _handle(self, identity: bytes, header: dict, frames: list) -> list[Reply]:
        op = header["op"]
        try:
            if op == Op.INIT_KEY:
                return self._init_key(identity, header)
            state = self.keys[header["key"]]
            if op == Op.PUSH:
                return state.push(identity, header["round"], state.decode(header, frames))
            return state.pull(identity, header["round"])
        except PushError as e:
            log.warning("dropped %s from %s: %s", op.name, header["from"], e)
            return [Reply(identity, Op.ERROR, {"message": str(e), "key": header["key"],
                                               "round": header.get("round", 0)}, [])]

    def _init_key(self, identity: bytes, h: dict) -> list[Reply]:
        state = self.keys.get(h["key"])
        if state is None:
            self.keys[h["key"]] = KeyState(h["key"], h["name"], h["count"], h["dtype"],
                                           self._num_workers, self._async)
        else:
            state.check_init(h["name"], h["count"], h["dtype"])
        return []
