"""Why a node cannot reach the scheduler, said at once: a watch on its connection's handshakes.

A node whose GRADPRESS_SECURITY differs from the scheduler's (curve against auth: another
ZeroMQ mechanism), or whose job secret does (CURVE keys that do not match), connects, fails
the handshake and retries for ever: nothing was logged on either side, and the node stopped
at its connect timeout saying only that no address book came (or, its queue full, with
ZeroMQ's bare ``Again``). libzmq reports each failed handshake on a socket monitor: one of
another mechanism (which libzmq does not retry), or a few failed ones in a row (one could be
a connection cut at the wrong moment), stop registration naming both settings. The watch
lasts only until the node is registered.
"""
from __future__ import annotations

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..config import Settings
from ..errors import JobError

FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
          | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
FAILURES_TO_STOP = 3


class HandshakeRefused(JobError):
    """The scheduler's end of the connection refuses this node's security settings."""


class HandshakeWatch:
    """The failed handshakes of ``sock`` (a DEALER to the scheduler), counted; ``check``
    raises HandshakeRefused at one of another mechanism, or once FAILURES_TO_STOP failed."""

    def __init__(self, sock: zmq.Socket, settings: Settings, role: str):
        self.sock, self.settings, self.role = sock, settings, role
        self.monitor = sock.get_monitor_socket(FAILED)
        self.failures, self.mechanism = 0, False

    def check(self) -> None:
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)
            self.failures += 1
            self.mechanism |= event["event"] == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        if self.mechanism or self.failures >= FAILURES_TO_STOP:
            raise HandshakeRefused(self.message())

    def message(self) -> str:
        s = self.settings
        why = ("it speaks another security mechanism" if self.mechanism
               else "the encryption handshake fails: its job secret is not this node's")
        return (f"{self.role}: the scheduler at {s.root_uri}:{s.root_port} refused {self.failures} connection "
                f"handshake(s) in a row ({why}): this node has GRADPRESS_SECURITY={s.security}; every node of a "
                f"job needs the scheduler's GRADPRESS_SECURITY and the same job secret (GRADPRESS_JOB_SECRET or "
                f"GRADPRESS_JOB_SECRET_FILE)")

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
