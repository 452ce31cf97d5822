"""What the communication thread does with a push_pull whose source is still being filled
(gradpress/torch/staging.py: a CUDA tensor's asynchronous copy into a pinned buffer): it
waits for the job's ``ready`` event before it reads the source, once, on its own thread.
(The pinned copies themselves, and the stream ordering, run in tests/gpu on a GPU.)"""
import collections
from types import SimpleNamespace

import numpy as np

from gradpress.worker.stages import PartitionStages


class RecordingEvent:
    def __init__(self, log):
        self.log = log

    def synchronize(self):
        self.log.append("ready")


def test_the_source_is_read_only_after_its_ready_event():
    log = []
    src = np.arange(8, dtype=np.float32)

    class Codec:
        name = "onebit"

        def compress(self, chunk, key, round, lr):
            log.append(("compress", chunk.copy()))
            return {}, []
    job = SimpleNamespace(ready=RecordingEvent(log), src=src, tensor=SimpleNamespace(layout=None, compressor=Codec()),
                          lr=None, early_payload=lambda wk, round: None)
    stages = SimpleNamespace(tracer=SimpleNamespace(add=lambda *a, **k: None),
                             await_source=PartitionStages.await_source)
    for index in (0, 1):  # two partitions of one job: one wait
        op = SimpleNamespace(job=job, chunk=src[4 * index:4 * index + 4], wkey=SimpleNamespace(key=index, via=None),
                             round=0)
        PartitionStages.compress(stages, op)
    assert log[0] == "ready" and [e[0] for e in log[1:]] == ["compress", "compress"]
    assert job.ready is None


def test_without_a_ready_event_nothing_is_waited_for():
    job = SimpleNamespace(ready=None, tensor=SimpleNamespace(layout=None, compressor=None), lr=None)
    op = SimpleNamespace(job=job, chunk=np.zeros(4, np.float32), wkey=SimpleNamespace(key=0), round=0)
    assert PartitionStages.compress(SimpleNamespace(await_source=PartitionStages.await_source), op) is None


def test_a_failed_push_pulls_buffer_is_never_reused(monkeypatch):
    """A CUDA tensor's pinned staging buffer (torch/staging.py): where its push_pull failed,
    the job's other partitions may still be sent from it, so the next call of that name must
    not copy its gradient into it; where it succeeded, the buffer is the name's again."""
    import torch

    from gradpress.torch.staging import HostStaging
    from gradpress.kernels.cuda import streams
    monkeypatch.setattr(streams, "_events", collections.defaultdict(collections.deque))
    staging = HostStaging()
    for outcome in ("done", "failed"):
        buffer = torch.empty(4)  # (a host tensor stands in for a pinned one: this host has no GPU)
        staging._buffers["w"] = buffer
        staging._busy.add("w")
        copied = staging._copied["w"] = (object(), 3)   # the copy in's event, on GPU 3
        getattr(staging, outcome)("w", buffer)
        assert "w" not in staging._busy and "w" not in staging._copied
        assert (staging._buffers.get("w") is buffer) == (outcome == "done"), outcome
        # reused once the average is out (a blocking event: the host waits for it); a failed
        # job's partitions still queued may wait on it
        assert (copied[0] in streams._events[3, True]) == (outcome == "done"), outcome
    other = torch.empty(4)   # the second of one name in flight at once: not the name's buffer
    staging._buffers["w"] = kept = torch.empty(4)
    staging._busy.add("w")
    staging.failed("w", other)
    assert staging._buffers["w"] is kept and "w" in staging._busy


def test_a_machines_owner_waits_for_its_staged_source_off_the_communication_thread(monkeypatch):
    """The worker that sums a key for its machine (local reduce) and whose source is still
    being copied into pinned memory (a staged CUDA tensor) hands the copy's event to the
    host-copies thread, as a CUDA chunk's own copy is, and sums once it is done; the
    communication thread never waits on the event."""
    from gradpress.worker.relay import Relay

    class Filling:
        def synchronize(self):
            raise AssertionError("the communication thread waited for the copy")
    later = []
    relay = Relay.__new__(Relay)
    relay.keys = {}
    relay.host_copies = SimpleNamespace(after=lambda done, then, what=None: later.append((done, then, what)))
    tried = []
    monkeypatch.setattr(relay, "_try", lambda key, rnd: tried.append((key, rnd)))
    wkey = SimpleNamespace(key=7, describe=lambda: "tensor 'w' [0:4]", in_flight=None)
    op = SimpleNamespace(wkey=wkey, round=3, chunk=np.zeros(4, np.float32))
    wkey.in_flight = op
    filling = Filling()
    relay.contribute(op, filling)
    assert tried == [] and relay.keys[7].copying == {3}
    (done, then, what), = later
    assert done is filling and what() == "tensor 'w' [0:4]"
    then()   # on the communication thread once the copy is done
    assert tried == [(7, 3)] and relay.keys[7].copying == set()
    relay.contribute(SimpleNamespace(wkey=wkey, round=4, chunk=np.zeros(4, np.float32)))   # filled: at once
    assert tried == [(7, 3), (7, 4)] and len(later) == 1
