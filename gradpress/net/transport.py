"""ZeroMQ plumbing: sockets, sending and receiving multipart messages.

Buffers go out with ``copy=False`` (zero-copy) when they are large enough for that
to pay; small ones are copied, which ZeroMQ does faster than it can track a
reference. Received data frames stay ``zmq.Frame`` objects so that readers can
``np.frombuffer`` them without a copy.
"""
from __future__ import annotations

import logging
import os
import socket
from typing import Any, Sequence

import zmq

from . import protocol
from .protocol import Op

log = logging.getLogger(__name__)

# Below this, copying is cheaper than ZeroMQ's zero-copy bookkeeping.
ZERO_COPY_MIN_BYTES = 65536
# Unsent messages are dropped this long after close: a dead peer never blocks exit.
LINGER_MS = 1000


# Two ZeroMQ I/O threads: one alone caps a server's socket throughput below what the
# engine threads can sum.
IO_THREADS = 2


def context() -> zmq.Context:
    return zmq.Context.instance(io_threads=IO_THREADS)


def router(ctx: zmq.Context, host: str, port: int) -> tuple[zmq.Socket, int]:
    """A ROUTER bound to ``host:port`` (port 0: any free port). Returns it and its port."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    # Fail loudly rather than silently drop when a peer identity is unknown.
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    bind_host = "*" if host in ("", "0.0.0.0") else host
    if port == 0:
        port = sock.bind_to_random_port(f"tcp://{bind_host}")
    else:
        sock.bind(f"tcp://{bind_host}:{port}")
    return sock, port


def dealer(ctx: zmq.Context, host: str, port: int, identity: bytes) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(f"tcp://{host}:{port}")
    return sock


def send(sock: zmq.Socket, op: Op, sender: str, buffers: Sequence[Any] = (),
         identity: bytes | None = None, **fields: Any) -> None:
    """Send one message; ``identity`` addresses a peer of a ROUTER socket."""
    frames: list[Any] = [] if identity is None else [identity]
    frames.append(protocol.encode(op, sender, **fields))
    frames.extend(buffers)
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        nbytes = getattr(frame, "nbytes", None) or len(frame)
        sock.send(frame, zmq.SNDMORE if i < last else 0, copy=nbytes < ZERO_COPY_MIN_BYTES)


def recv(sock: zmq.Socket, routed: bool) -> tuple[bytes | None, dict | None, list[zmq.Frame]]:
    """Receive one message. Never raises on bad input.

    Returns:
        (identity or None, decoded header or None if malformed, data frames).
        A malformed message is logged here; callers drop it.
    """
    frames = sock.recv_multipart(copy=False)
    identity = None
    if routed:
        identity = frames[0].bytes
        frames = frames[1:]
    if not frames:
        log.warning("dropped an empty message from %r", identity)
        return identity, None, []
    try:
        header = protocol.decode(frames[0].buffer)
    except protocol.ProtocolError as e:
        log.warning("dropped a malformed message from %r: %s", identity, e)
        return identity, None, []
    return identity, header, frames[1:]


def local_address_towards(host: str, port: int) -> str:
    """The local IP address that routes towards ``host`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(host), port or 9))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def node_name(role: str, rank: int) -> str:
    """How a node is named in logs and errors: ``"worker 1"``."""
    return f"{role} {rank}" if rank >= 0 else f"{role} (pid {os.getpid()})"
