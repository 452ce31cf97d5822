"""When the flight compresses a tensor's partitions together (``PartitionFlight._together``,
``GRADPRESS_GROUP_PARTITIONS``), and the rule that keeps a later job's partition from taking
a key whose next payload an earlier job already made: a real flight and key table, the
stages replaced by a recorder that makes payloads early as ``compress_tensor`` does."""
from dataclasses import replace

import numpy as np

from gradpress.compressors.spec import CodecSpec
from gradpress.config import Settings
from gradpress.worker.deadlines import Deadlines
from gradpress.worker.flight import PartitionFlight
from gradpress.worker.future import Future
from gradpress.worker.jobs import PartitionOp, PushPull
from gradpress.worker.keys import KeyTable, Tensor

SPEC = CodecSpec.from_params({"compressor": "onebit", "ef": "vanilla"})


class Stages:
    """Records what the flight asks; ``compress_tensor`` makes every key's payload early."""

    def __init__(self):
        self.together, self.pushed = [], []

    def introduce(self, wk, src):
        pass

    def await_source(self, job):
        pass

    def compress_tensor(self, job):
        self.together.append(job)
        for wk in job.tensor.keys:
            wk.compressed_by = job
            job.compressed[wk.key] = (wk.next_round, ({"early": True}, []))

    def compress(self, op):
        return op.job.early_payload(op.wkey, op.round)

    def send(self, op, payload):
        self.pushed.append((op.wkey.index, op.round, op.job.lr, payload is not None))


def setup(group: bool = True, spec=SPEC, parts=(4, 4, 2)):
    table = KeyTable()
    t = Tensor("t", sum(parts), "float32", 1, list(parts), [0] * len(parts), spec)
    table.add(t, 1)
    stages = Stages()
    flight = PartitionFlight(replace(Settings(), group_partitions=group, scheduling_credit=64), stages, table,
                             Deadlines())
    return flight, stages, t


def job(t, lr):
    return PushPull(t, np.zeros(t.count, np.float32), np.zeros(t.count, np.float32), 1, Future("test"),
                    len(t.keys), lr)


def test_asked_once_per_job_and_only_with_the_setting_a_codec_and_several_partitions():
    flight, stages, t = setup()
    a = job(t, 0.1)
    assert flight._together(PartitionOp(a, t.keys[0]))
    assert not flight._together(PartitionOp(a, t.keys[1])), "asked again for the same job"
    for off in (setup(group=False), setup(spec=None), setup(parts=(8,))):
        flight, _, t = off
        assert not flight._together(PartitionOp(job(t, 0.1), t.keys[0]))


def test_not_while_a_partition_of_the_tensor_is_busy_or_reduced_locally():
    for busy in ("in_flight", "held", "compressed_by", "via", "pushers"):
        flight, _, t = setup()
        setattr(t.keys[2], busy, {"held": [object()], "via": 1, "pushers": 2}.get(busy, object()))
        assert not flight._together(PartitionOp(job(t, 0.1), t.keys[0])), busy


def test_a_later_jobs_partition_waits_for_the_key_an_earlier_job_made_its_payload_for():
    flight, stages, t = setup()
    a, b = job(t, 0.1), job(t, 0.2)
    flight.start(a, priority=0)
    flight._queue.take()  # a's first partition goes first, and makes the others' payloads
    flight._queue.release()
    flight._send(PartitionOp(a, t.keys[0]))
    assert stages.together == [a] and stages.pushed == [(0, 0, 0.1, True)]
    flight.start(b, priority=100)  # b first by priority: its partitions 1 and 2 must still wait for a's
    flight.dispatch()
    rounds = {(index, round_): lr for index, round_, lr, _ in stages.pushed}
    assert rounds[(1, 0)] == 0.1 and rounds[(2, 0)] == 0.1, f"a key's round 0 went to the later job: {rounds}"
    assert all(early for *_, early in stages.pushed)
    assert all(wk.compressed_by is None for wk in t.keys)
    assert [k for k in t.keys if k.held], "b's partitions wait for a's rounds to land"
