"""A node whose security settings the scheduler's end refuses stops registering at once,
naming them (net/handshake.py): it retried in silence until its connect timeout, then said
no address book came, or died of ZeroMQ's bare ``Again``."""
import threading
import time

import pytest

from gradpress.config import Settings
from gradpress.net import transport
from gradpress.net.handshake import HandshakeRefused
from gradpress.net.node import SchedulerLink
from gradpress.scheduler.scheduler import Scheduler

SECRET, OTHER = "s" * 32, "o" * 32
COMMON = dict(num_worker=1, num_server=1, root_uri="127.0.0.1", node_host="127.0.0.1", heartbeat_interval_s=0.2,
              heartbeat_timeout_s=20, connect_timeout_s=30)


@pytest.mark.parametrize("security,secret,why", [("curve", OTHER, "the encryption handshake fails"),
                                                 ("auth", SECRET, "it speaks another security mechanism")])
def test_a_node_the_schedulers_security_refuses_stops_naming_the_settings(security, secret, why):
    scheduler = Scheduler(Settings(role="scheduler", root_port=0, job_secret=SECRET, **COMMON))
    running = threading.Thread(target=scheduler.run, daemon=True)
    running.start()
    link = SchedulerLink(Settings(role="worker", root_port=scheduler.port, job_secret=secret, security=security,
                                  **COMMON), "worker", transport.context())
    start = time.monotonic()
    try:
        with pytest.raises(HandshakeRefused, match=rf"\({why}.*GRADPRESS_SECURITY={security}; every node"):
            link.register()
        assert time.monotonic() - start < 10, "not at once"
    finally:
        link.close()
        scheduler.exit_code = 0
        running.join(timeout=5)
