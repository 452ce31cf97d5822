"""Why a node cannot reach the scheduler, said early (net/handshake.py): another security
mechanism stops its registration at once, naming the settings; failed handshakes (a wrong
job secret) are warned of and named in the deadline's error, and do not stop a node whose
scheduler is merely not listening yet behind something that accepts and closes connections.
(It retried in silence until its connect timeout, then said no address book came, or died
of ZeroMQ's bare ``Again``.)"""
import logging
import socket
import struct
import threading
import time

import pytest

from gradpress.config import Settings
from gradpress.errors import OpTimeoutError
from gradpress.net import transport
from gradpress.net.handshake import HandshakeRefused
from gradpress.net.node import SchedulerLink
from gradpress.scheduler.scheduler import Scheduler

SECRET, OTHER = "s" * 32, "o" * 32
COMMON = dict(num_worker=1, num_server=1, root_uri="127.0.0.1", node_host="127.0.0.1", heartbeat_interval_s=0.2,
              heartbeat_timeout_s=20, connect_timeout_s=30)


class _Job:
    def __init__(self, port: int = 0):
        self.scheduler = Scheduler(Settings(role="scheduler", root_port=port, job_secret=SECRET, **COMMON))
        self.thread = threading.Thread(target=self.scheduler.run, daemon=True)
        self.thread.start()

    def link(self, **settings) -> SchedulerLink:
        values = {**COMMON, "root_port": self.scheduler.port, "job_secret": SECRET, **settings}
        return SchedulerLink(Settings(role="worker", **values), "worker", transport.context())

    def stop(self):
        self.scheduler.exit_code = 0
        self.thread.join(timeout=5)


def test_another_security_mechanism_stops_registration_at_once_naming_it():
    job = _Job()
    link = job.link(security="auth")
    time.sleep(0.5)  # (made long before it registers, as a server warming up its kernels: seen all the same)
    start = time.monotonic()
    try:
        with pytest.raises(HandshakeRefused, match=r"speaks another security mechanism: this node has "
                                                   r"GRADPRESS_SECURITY=auth; every node of a job needs"):
            link.register()
        assert time.monotonic() - start < 5, "not at once"
    finally:
        link.close()
        job.stop()


def test_a_wrong_secret_is_warned_of_and_named_at_the_deadline(caplog):
    job = _Job()
    link = job.link(job_secret=OTHER, connect_timeout_s=3)
    try:
        with caplog.at_level(logging.WARNING, "gradpress.net.handshake"), \
                pytest.raises(OpTimeoutError, match=r"no address book .*handshake\(s\) with it failed in a row: "
                                                    r"a job secret that is not the scheduler's"):
            link.register()
        assert "handshake(s) with it failed in a row" in caplog.text
    finally:
        link.close()
        job.stop()


def test_failed_handshakes_before_the_scheduler_listens_do_not_stop_the_node():
    """What a proxy in front of a scheduler not yet up does: accept and close."""
    proxy = _below_ephemeral_ports()
    port = proxy.getsockname()[1]
    settings = Settings(role="worker", **dict(COMMON, root_port=port, job_secret=SECRET))
    link = SchedulerLink(settings, "worker", transport.context())
    outcome = []
    registering = threading.Thread(target=lambda: _register(link, outcome), daemon=True)
    registering.start()
    proxy.settimeout(0.1)
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        try:
            conn = proxy.accept()[0]
            # reset, not closed: a closed connection's TIME_WAIT would hold the port from the scheduler
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
        except socket.timeout:
            pass
    proxy.close()
    job = _bound(port)
    try:
        until = time.monotonic() + 10
        while not job.scheduler.roster.members and time.monotonic() < until and not outcome:
            time.sleep(0.05)
        assert not outcome and len(job.scheduler.roster.members) == 1, outcome
    finally:
        job.stop()
        registering.join(timeout=1)  # (it waits for a job that never starts: a daemon)


def _below_ephemeral_ports() -> socket.socket:
    """A listener on a port the kernel never gives a connection's own end: a client retrying
    a port of that range on loopback may get it as its own and connect to itself, holding it."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
        low = int(fh.read().split()[0])
    for port in range(low - 1, 1024, -7):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        s.listen()
        return s
    raise AssertionError("no free port below the ephemeral range")


def _bound(port: int) -> _Job:
    """A scheduler on the proxy's port, once the closed connections let it bind there."""
    for _ in range(50):
        try:
            return _Job(port)
        except OSError:
            time.sleep(0.1)
    return _Job(port)


def _register(link, outcome):
    try:
        link.register()
    except Exception as e:  # noqa: BLE001 - the test reads what it was
        outcome.append(e)
