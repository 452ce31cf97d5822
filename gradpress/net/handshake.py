"""Why a node cannot reach the scheduler, said early: a watch on its connection's handshakes.

A node whose GRADPRESS_SECURITY differs from the scheduler's (curve against auth: another
ZeroMQ mechanism), or whose job secret does (CURVE keys that do not match), connects, fails
the handshake and retries: nothing was logged on either side, and the node stopped at its
connect timeout saying only that no address book came (or, its queue full, with ZeroMQ's
bare ``Again``). libzmq reports each handshake on a socket monitor, attached before the
socket connects (a mechanism mismatch is tried once or twice only). A mechanism mismatch
stops registration at once, naming both settings. Other failures are what a wrong secret
gives, but also what a proxy in front of a scheduler not yet listening gives (a sidecar, a
published container port, ``kubectl port-forward`` accept and close): those are warned of
once and named in the deadline's error, and a handshake that succeeds clears them. The watch
lasts until the node is registered.
"""
from __future__ import annotations

import logging

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..config import Settings
from ..errors import JobError

log = logging.getLogger(__name__)

EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
          | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_SUCCEEDED)
MECHANISM_MISMATCH = 0x11000002  # ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH, the event's value
WARN_AFTER = 3


class HandshakeRefused(JobError):
    """The scheduler's end of the connection speaks another security mechanism."""


class HandshakeWatch:
    """The handshakes of ``sock`` (a DEALER to the scheduler, not yet connected)."""

    def __init__(self, sock: zmq.Socket, settings: Settings, role: str):
        self.sock, self.settings, self.role = sock, settings, role
        self.monitor: zmq.Socket | None = sock.get_monitor_socket(EVENTS)
        self.failures = 0

    def check(self) -> None:
        """Raises HandshakeRefused at a mechanism mismatch; warns once of other failures."""
        while self.monitor is not None and self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.failures = 0
                continue
            if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and event["value"] == MECHANISM_MISMATCH:
                raise HandshakeRefused(f"{self._where()} speaks another security mechanism: this node has "
                                       f"GRADPRESS_SECURITY={self.settings.security}; {self._alike()}")
            self.failures += 1
            if self.failures == WARN_AFTER:
                log.warning("%s: %s", self._where(), self.hint())

    def hint(self) -> str:
        """What the failed handshakes so far may mean ('' if none failed)."""
        if not self.failures:
            return ""
        return (f"{self.failures} connection handshake(s) with it failed in a row: a job secret that is not the "
                f"scheduler's ({self._alike()}), or a proxy in front of a scheduler not listening yet")

    def _where(self) -> str:
        return f"{self.role}: the scheduler at {self.settings.root_uri}:{self.settings.root_port}"

    @staticmethod
    def _alike() -> str:
        return ("every node of a job needs the scheduler's GRADPRESS_SECURITY and the same job secret "
                "(GRADPRESS_JOB_SECRET or GRADPRESS_JOB_SECRET_FILE)")

    def close(self) -> None:
        if self.monitor is not None:
            self.sock.disable_monitor()
            self.monitor.close(linger=0)
            self.monitor = None
