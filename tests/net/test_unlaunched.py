"""A worker started with plain ``python`` (no launcher, nothing saying where the scheduler
is) is told so at once and at its deadline, not only that no scheduler answered."""
import logging
import socket

import pytest

from cluster import TEST_SECRET
from gradpress.config import Settings
from gradpress.errors import OpTimeoutError
from gradpress.net import transport
from gradpress.net.node import SchedulerLink


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("env,hinted", [({}, True), ({"DMLC_ROLE": "worker"}, False),
                                        ({"DMLC_PS_ROOT_URI": "127.0.0.1"}, False)])
def test_a_worker_without_launcher_settings_is_told_how_to_start_the_job(monkeypatch, caplog, env, hinted):
    for name in ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "GRADPRESS_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings(role="worker", root_uri="127.0.0.1", root_port=_free_port(), node_host="127.0.0.1",
                        connect_timeout_s=0.5, heartbeat_interval_s=0.1, job_secret=TEST_SECRET)
    link = SchedulerLink(settings, "worker", transport.context())
    try:
        with caplog.at_level(logging.WARNING, logger="gradpress.net.node"), \
                pytest.raises(OpTimeoutError, match="no address book") as raised:
            link.register()
    finally:
        link.close()
    assert ("gradpress-launch --local" in str(raised.value)) == hinted, raised.value
    assert any("not started by a launcher" in r.getMessage() for r in caplog.records) == hinted
