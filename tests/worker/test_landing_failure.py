"""A landing that fails with the device's error (out of memory, a failed launch: neither a
bad reply nor a socket's) fails its push_pull at once, naming the tensor and the error; it
had left the op's flight with its future pending until ``synchronize``'s deadline."""
from collections import deque
from types import SimpleNamespace

import pytest

from gradpress.errors import JobError
from gradpress.net.protocol import Op
from gradpress.worker import flight
from gradpress.worker.flight import PartitionFlight
from gradpress.worker.future import Future
from gradpress.worker.scheduling import CreditQueue


def test_a_landing_that_raises_the_devices_error_fails_its_job(monkeypatch):
    future = Future("push_pull of tensor 'g'")
    job = SimpleNamespace(future=future, remaining=1, out=None, tensor=SimpleNamespace(name="g"))
    wkey = SimpleNamespace(key=7, in_flight=None, held=deque(), pushers=0, answers_from=lambda op, rank: rank == 0)
    op = SimpleNamespace(job=job, wkey=wkey, round=0, acked=True, deadline=None)
    wkey.in_flight = op

    class Stages:
        def land(self, op, h, frames):
            raise RuntimeError("CUDA out of memory")

        @staticmethod
        def endpoint(wk):
            return 0
    partitions = PartitionFlight.__new__(PartitionFlight)  # only what a reply's landing reads
    partitions.describe = lambda endpoint: f"server {endpoint}"
    partitions._queue, partitions.stages, partitions.relay = CreditQueue(credit=4), Stages(), None
    partitions.table = SimpleNamespace(get=lambda key: wkey if key == 7 else None, values=lambda: [wkey])
    monkeypatch.setattr(flight.transport, "recv",
                        lambda sock, routed: (None, {"op": Op.PULL_REPLY, "key": 7, "round": 0}, []))
    partitions.from_server(0, sock=None)
    assert wkey.in_flight is None
    with pytest.raises(JobError, match=r"tensor 'g': landing failed for key 7 \(from server 0\): CUDA out of memory"):
        future.result(0)
