"""A CrossBarrier forward waiting for a parameter's update when the job fails meanwhile (a
lost server: no update will come) raises that failure at once, not a timeout after the op
deadline. In-process, the worker a stand-in."""
import threading
from types import SimpleNamespace

import pytest

from gradpress.errors import NodeLostError
from gradpress.torch import cross_barrier, ops


def test_a_wait_for_an_update_raises_the_jobs_failure_once_it_happens(monkeypatch):
    client = SimpleNamespace(fatal=None)
    monkeypatch.setattr(ops, "_client", client)
    monkeypatch.setattr(ops, "_settings", SimpleNamespace(op_timeout_s=300))
    monkeypatch.setattr(cross_barrier, "FATAL_CHECK_S", 0.05)
    lost = NodeLostError("lost server 0 (127.0.0.1:5000): no heartbeat for 10 s")
    threading.Timer(0.2, lambda: setattr(client, "fatal", lost)).start()
    with pytest.raises(NodeLostError) as caught:
        cross_barrier._CrossBarrier._wait(SimpleNamespace(_error=None), threading.Event())
    assert caught.value is lost
