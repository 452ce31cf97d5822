"""ZeroMQ plumbing: sockets, sending and receiving multipart messages.

Buffers go out with ``copy=False`` (zero-copy) when they are large enough for that
to pay; small ones are copied, which ZeroMQ does faster than it can track a
reference. Received data frames stay ``zmq.Frame`` objects so that readers can
``np.frombuffer`` them without a copy.
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import threading
from typing import Any, Sequence

import zmq

from . import auth, protocol
from .. import logs
from ..config import Settings
from .guard import PeerGuard
from .limits import HIGH_WATER_MARK, Limits
from .protocol import Op

log = logging.getLogger(__name__)

# Below this, copying is cheaper than ZeroMQ's zero-copy bookkeeping.
ZERO_COPY_MIN_BYTES = 65536
# Unsent messages are dropped this long after close: a dead peer never blocks exit.
LINGER_MS = 1000


# Two ZeroMQ I/O threads at least: one alone caps a server's socket throughput below what
# the engine threads can sum. With CURVE each connection's bytes are encrypted on the I/O
# thread that owns it (about 0.8-0.9 GB/s on these cores), so a process with more cores
# gets more of them: connections spread over them, and encryption over the cores.
IO_THREADS = 2
MAX_IO_THREADS = 16


def io_threads(settings: Settings) -> int:
    """``GRADPRESS_IO_THREADS``, or its default: one per core with CURVE (2 to 16), else 2."""
    if settings.io_threads > 0:
        return settings.io_threads
    if settings.security == "curve":
        from .. import host
        return max(IO_THREADS, min(MAX_IO_THREADS, int(host.cores())))
    return IO_THREADS


def context(settings: Settings | None = None) -> zmq.Context:
    """The process's ZeroMQ context; its I/O threads are set by whoever makes it first (the
    role, from its settings)."""
    return zmq.Context.instance(io_threads=io_threads(settings) if settings is not None else IO_THREADS)


def own_context(settings: Settings) -> zmq.Context:
    """A context of a worker's own, which it ends (``deliver_queued``) once its communication
    thread closed every socket: what that thread sent last (the SHUTDOWN acknowledgement) is
    then delivered before ``finish()`` returns. With the process's shared context, a script
    that exited at once after ``finish()`` lost it in 2 of 6 jobs, and the scheduler waited
    PS_HEARTBEAT_TIMEOUT for it."""
    return zmq.Context(io_threads=io_threads(settings))


def deliver_queued(ctx: zmq.Context, wait_s: float = LINGER_MS / 1000 + 1.0) -> bool:
    """At the end of a scheduler's or server's process (a worker's communication thread),
    once its sockets are closed: end the context, so that ZeroMQ's I/O threads deliver what
    the sockets still queue (each within its LINGER_MS) instead of the process dropping it
    as it exits. Without it a scheduler that had just told every member which node was lost
    could exit before some of them heard it, and they reported the scheduler lost instead.
    Waits at most ``wait_s`` (a socket some thread left open would hold the context
    forever); returns whether it ended."""
    ending = threading.Thread(target=ctx.term, name="gradpress-zmq-term", daemon=True)
    ending.start()
    ending.join(wait_s)
    if ending.is_alive():
        log.warning("ZeroMQ still held a socket open %.1f s after the end: what it queued may be lost", wait_s)
    return not ending.is_alive()


def job_socket(ctx: zmq.Context, kind: int, settings: Settings, binds: bool) -> zmq.Socket:
    """A socket of the job, with the options every one of them shares: CURVE with the job's
    keys (server on a socket that binds, client on one that connects) and the linger.

    Raises:
        JobSecretError: no usable job secret (and not GRADPRESS_INSECURE=1).
    """
    keys = auth.job_keys(settings)  # first: a missing secret fails before a socket exists
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    bound(sock, settings)
    (auth.make_server if binds else auth.make_client)(sock, keys)
    return sock


def bound(sock: zmq.Socket, settings: Settings) -> None:
    """What one peer can cost this socket: frames above the limit (net/limits.py) disconnect
    their sender before they are stored, and each peer's queue holds HIGH_WATER_MARK messages.
    Set before bind/connect: libzmq copies the options into each connection it makes."""
    lim = Limits(settings.partition_bytes)
    sock.setsockopt(zmq.MAXMSGSIZE, lim.scheduler_frame_bytes if settings.role == "scheduler"
                    else lim.data_frame_bytes)
    sock.setsockopt(zmq.SNDHWM, HIGH_WATER_MARK)
    sock.setsockopt(zmq.RCVHWM, HIGH_WATER_MARK)
    # A DEALER's send waits only while its queue holds HIGH_WATER_MARK messages (credit keeps
    # a worker far below): a peer that reads nothing for a heartbeat timeout is dead, and the
    # send raises zmq.Again instead of waiting for ever. (ROUTERs send through an Outbox.)
    if sock.type == zmq.DEALER:
        sock.setsockopt(zmq.SNDTIMEO, int(settings.heartbeat_timeout_s * 1000))


def router(ctx: zmq.Context, settings: Settings, port: int) -> tuple[zmq.Socket, int]:
    """A ROUTER bound to ``port`` (0: any free port) at this node's own address
    (:func:`listen_host`). Returns it and its port."""
    sock, ports = lanes_router(ctx, settings, port, 1)
    return sock, ports[0]


def server_lanes(settings: Settings) -> int:
    """``GRADPRESS_SERVER_LANES``, or its default: one per I/O thread with CURVE, else 1."""
    if settings.server_lanes > 0:
        return min(settings.server_lanes, io_threads(settings))
    return io_threads(settings) if settings.security == "curve" else 1


def lanes_router(ctx: zmq.Context, settings: Settings, port: int, lanes: int) -> tuple[zmq.Socket, list[int]]:
    """A ROUTER listening on ``lanes`` endpoints, the i-th tied to I/O thread i (ZMQ_AFFINITY,
    which libzmq copies into every connection it accepts there): ``port`` (0: any free port)
    and, for a fixed port, the ones after it. libzmq gives an accepted connection the least
    loaded I/O thread, but it counts the load only once the thread has taken the connection
    over, so connections accepted together (a job's workers, which connect as the address
    book arrives) pile onto one thread: 4 at once went 3 to one thread and 1 to another
    here. With CURVE a thread encrypts its connections' bytes, so a server's cores stayed idle.
    Returns the socket and its ports, lane by lane (no more lanes than ``ctx`` has threads)."""
    lanes = max(1, min(lanes, ctx.get(zmq.IO_THREADS)))
    sock = job_socket(ctx, zmq.ROUTER, settings, binds=True)
    # Fail loudly rather than silently drop when a peer identity is unknown.
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    host = listen_host(settings)
    ports: list[int] = []
    want = port
    try:
        for lane in range(lanes):
            if lanes > 1:
                sock.setsockopt(zmq.AFFINITY, 1 << lane)
            want = 0 if port == 0 else port + lane
            if want == 0:
                ports.append(sock.bind_to_random_port(f"tcp://{host}"))
            else:
                sock.bind(f"tcp://{host}:{want}")
                ports.append(want)
    except zmq.ZMQError as e:
        sock.close(linger=0)
        lane_note = f" (lane {len(ports)} of {lanes}: GRADPRESS_SERVER_LANES)" if lanes > 1 else ""
        if e.errno == errno.EADDRINUSE:
            hint = (f"port {want} is taken by another process (another job's, or this job's started twice): "
                    f"free it, or set another port (DMLC_PS_ROOT_PORT for the scheduler, GRADPRESS_SERVER_PORT "
                    f"for a server)")
        else:
            hint = f"DMLC_NODE_HOST={settings.node_host!r} must be an address of this machine"
        raise OSError(f"cannot listen at {host}:{want}{lane_note} ({e}); {hint}") from None
    sock.setsockopt(zmq.AFFINITY, 0)
    return sock, ports


def dealer(ctx: zmq.Context, settings: Settings, host: str, port: int, identity: bytes,
           io_thread: int | None = None, before_connect=None) -> zmq.Socket:
    """A DEALER connected to ``host:port``, calling itself ``identity``; its connection on I/O
    thread ``io_thread`` (modulo the context's count) where given, as ``lanes_router`` ties a
    server's (connections made together would otherwise share one). ``before_connect(sock)``
    runs before it connects (a monitor attached later misses the first handshakes)."""
    sock = job_socket(ctx, zmq.DEALER, settings, binds=False)
    sock.setsockopt(zmq.IDENTITY, identity)
    if io_thread is not None:
        sock.setsockopt(zmq.AFFINITY, 1 << (io_thread % ctx.get(zmq.IO_THREADS)))
    if before_connect is not None:
        before_connect(sock)
    sock.connect(f"tcp://{host}:{port}")
    return sock


# DMLC_NODE_HOST set to one of these: listen on every interface (the user asked for it).
ANY_HOST = ("0.0.0.0", "*")


def listen_host(settings: Settings) -> str:
    """Where this node listens: ``DMLC_NODE_HOST``, else the local address that routes to
    the scheduler; every interface only if ``DMLC_NODE_HOST=0.0.0.0`` says so."""
    if settings.node_host in ANY_HOST:
        return "*"
    return settings.node_host or local_address_towards(settings.root_uri, settings.root_port)


def announce_host(settings: Settings) -> str:
    """The address other nodes reach this node at (the one it listens on)."""
    host = listen_host(settings)
    return local_address_towards(settings.root_uri, settings.root_port) if host == "*" else host


def send(sock: zmq.Socket, op: Op, sender: str, buffers: Sequence[Any] = (),
         identity: bytes | None = None, nonblocking: bool = False, **fields: Any) -> None:
    """Send one message; ``identity`` addresses a peer of a ROUTER socket. ``nonblocking``:
    zmq.Again where the peer's queue is full, rather than waiting (a message is queued whole
    or not at all: its first frame decides)."""
    frames: list[Any] = [] if identity is None else [identity]
    frames.append(protocol.encode(op, sender, **fields))
    frames.extend(buffers)
    last, flags = len(frames) - 1, zmq.NOBLOCK if nonblocking else 0
    for i, frame in enumerate(frames):
        nbytes = getattr(frame, "nbytes", None) or len(frame)
        sock.send(frame, (zmq.SNDMORE if i < last else 0) | flags, copy=nbytes < ZERO_COPY_MIN_BYTES)


def recv(sock: zmq.Socket, routed: bool,
         guard: PeerGuard | None = None) -> tuple[bytes | None, dict | None, list[zmq.Frame]]:
    """Receive one message. Never raises on bad input.

    Args:
        guard: the receiving thread's PeerGuard (net/guard.py), if it keeps one: a cut-off
            peer's message is dropped undecoded, and a malformed one is charged to its
            sender and logged once per sender (else every one is logged).
    Returns:
        (identity or None, decoded header or None if malformed, data frames).
        A malformed message is logged here; callers drop it.
    """
    frames = sock.recv_multipart(copy=False)
    identity = None
    if routed:
        identity = frames[0].bytes
        frames = frames[1:]
        if guard is not None and guard.is_cut(identity):
            guard.charge(identity)  # counted only: it is cut off
            return identity, None, []
    why = ""
    if not frames:
        why = "dropped an empty message"
    else:
        try:
            return identity, protocol.decode(frames[0].buffer), frames[1:]
        except protocol.ProtocolError as e:
            why = f"dropped a malformed message: {logs.peer(e)}"
    if guard is None:
        log.warning("%s from %s", why, logs.peer(identity))
    else:
        guard.dropped(identity, why)
        if identity is not None:
            guard.charge(identity)
    return identity, None, []


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
