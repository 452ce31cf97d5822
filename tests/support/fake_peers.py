"""A scripted scheduler and servers for testing one worker's client on its own.

Real ZeroMQ ROUTER sockets on 127.0.0.1, driven by the test thread: the test reads
what the client sent (heartbeats skipped) and answers exactly what it wants, so each
stage of the client's pipeline can be checked message by message.
"""
from __future__ import annotations

import time

import numpy as np
import zmq

from cluster import TEST_SECRET
from gradpress.config import Settings
from gradpress.net import auth, transport
from gradpress.net.protocol import Op
from gradpress.worker import WorkerClient

NAME = "scheduler 0"


class FakePeers:
    def __init__(self, servers: int = 1):
        self.ctx = zmq.Context()
        self.scheduler, self.port = self._router()
        self.servers = [self._router() for _ in range(servers)]
        self.worker_identity: bytes | None = None
        self.client: WorkerClient | None = None

    def _router(self) -> tuple[zmq.Socket, int]:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        auth.make_server(sock, auth.job_keys(Settings(job_secret=TEST_SECRET)))  # the client talks CURVE
        return sock, sock.bind_to_random_port("tcp://127.0.0.1")

    def settings(self, **overrides) -> Settings:
        values = dict(num_worker=1, num_server=len(self.servers), root_uri="127.0.0.1", root_port=self.port,
                      node_host="127.0.0.1", shm=False, heartbeat_interval_s=0.2, heartbeat_timeout_s=30.0,
                      connect_timeout_s=20.0, op_timeout_s=20.0, job_secret=TEST_SECRET)
        values.update(overrides)
        return Settings(**values)

    def start_client(self, **overrides) -> WorkerClient:
        """A client registered with these peers (as worker 0 of a one-worker job)."""
        self.client = WorkerClient(self.settings(**overrides))
        self.client.comm.start()  # start() would block on the address book we have yet to send
        _, h, _ = self.from_worker()
        assert h["op"] == Op.REGISTER and h["role"] == "worker"
        nodes = [{"role": "server", "rank": i, "host": "127.0.0.1", "port": p} for i, (_, p) in enumerate(self.servers)]
        nodes.append({"role": "worker", "rank": 0, "host": "127.0.0.1", "port": 0})
        self.to_worker(Op.ADDRESS_BOOK, rank=0, nodes=nodes, num_workers=1, num_servers=len(self.servers))
        assert self.client.comm.ready.wait(20), "the client did not take the address book"
        return self.client

    def from_worker(self, timeout_s: float = 10.0) -> tuple[bytes, dict, list]:
        """The next message the client sent the scheduler (heartbeats skipped)."""
        return self._recv(self.scheduler, timeout_s, remember=True)

    def from_worker_at(self, server: int, timeout_s: float = 10.0) -> tuple[bytes, dict, list]:
        """The next message the client sent server ``server``."""
        return self._recv(self.servers[server][0], timeout_s)

    def nothing_at(self, server: int, wait_s: float = 0.3) -> bool:
        """True if server ``server`` receives nothing (but heartbeats) for ``wait_s``."""
        sock = self.servers[server][0]
        return not sock.poll(wait_s * 1000)

    def _recv(self, sock: zmq.Socket, timeout_s: float, remember: bool = False) -> tuple[bytes, dict, list]:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            assert left > 0 and sock.poll(left * 1000), "the client sent nothing in time"
            identity, h, frames = transport.recv(sock, routed=True)
            if remember:
                self.worker_identity = identity
            if h is not None and h["op"] != Op.HEARTBEAT:
                return identity, h, frames

    def to_worker(self, op: Op, buffers=(), **fields) -> None:
        transport.send(self.scheduler, op, NAME, buffers, identity=self.worker_identity, **fields)

    def reply_from(self, server: int, identity: bytes, op: Op, buffers=(), **fields) -> None:
        transport.send(self.servers[server][0], op, f"server {server}", buffers, identity=identity, **fields)

    def declare(self, name: str, tensor_id: int, servers: list[int]) -> dict:
        """Answer the client's DECLARE of ``name``; returns that DECLARE."""
        _, h, _ = self.from_worker()
        assert h["op"] == Op.DECLARE and h["name"] == name, h
        self.to_worker(Op.DECLARED, name=name, tensor_id=tensor_id, servers=servers)
        return h

    def first_push(self, calls, src: np.ndarray, out: np.ndarray, name: str = "g") -> tuple:
        """Start a push_pull of ``src`` into ``out`` on ``calls``' pool, declare it (id 1, on
        server 0) and take its INIT_KEY and PUSH there: (its future, the worker's identity
        at server 0, the PUSH header)."""
        fut = calls.submit(lambda: self.client.push_pull_async(name, src, out, 1, 0))
        self.declare(name, tensor_id=1, servers=[0])
        identity, _, _ = self.from_worker_at(0)  # INIT_KEY
        _, push, _ = self.from_worker_at(0)
        return fut, identity, push

    def serve_round(self, server: int, result: np.ndarray, ack: bool = True) -> dict:
        """Take one PUSH, which carries its PULL (``pull``), at ``server`` (INIT_KEY/STATE
        before it are skipped and recorded in ``self.seen``) and answer with ``result``;
        returns the PUSH header."""
        self.seen = []
        while True:
            identity, h, frames = self.from_worker_at(server)
            if h["op"] == Op.PUSH:
                break
            self.seen.append((h, frames))
        push, push_frames = h, frames
        self.push_frames = push_frames
        if ack:
            self.reply_from(server, identity, Op.PUSH_ACK, key=h["key"], round=h["round"])
        assert h.get("pull") is True, "a push goes with its pull"
        self.reply_from(server, identity, Op.PULL_REPLY, [result], key=h["key"], round=h["round"],
                        dtype=result.dtype.name, count=result.size)
        return push

    def close(self) -> None:
        if self.client is not None and not self.client.comm.stopped.is_set():
            self.client.comm.stopped.set()
            self.client.comm.wake()
            self.client.comm.join(timeout=5)
        for sock in [self.scheduler] + [s for s, _ in self.servers]:
            sock.close(linger=0)
        self.ctx.term()
