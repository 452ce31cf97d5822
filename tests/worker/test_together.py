"""When the flight compresses a tensor's partitions together (``grouped.take_rounds``,
``GRADPRESS_GROUP_PARTITIONS``), and the rule that keeps a later job's partition from taking
a key whose next payload an earlier job already made: a real flight and key table, the
stages replaced by a recorder that makes payloads early as ``compress_tensor`` does; and the
same with the encoders run on the host-copies thread, as a CUDA tensor's are."""
import threading
from dataclasses import replace

import numpy as np
import pytest

from gradpress.compressors.spec import CodecSpec
from gradpress.config import Settings
from gradpress.errors import JobError, OpTimeoutError
from gradpress.worker import grouped
from gradpress.worker.deadlines import Deadlines
from gradpress.worker.flight import PartitionFlight
from gradpress.worker.future import Future
from gradpress.worker.host_copies import HostCopies
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

    @staticmethod
    def compresses_together(job):
        return True

    @staticmethod
    def encodes_on_device(op):
        return False

    def compress_tensor(self, job, rounds):
        self.together.append(job)
        assert all(wk.compressed_by is job for wk in job.tensor.keys), "the flight marks the keys first"
        for wk, made_for in zip(job.tensor.keys, rounds):
            job.compressed[wk.key] = (made_for, ({"early": True}, []))

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


def together(flight, op):
    """What the flight asks as it sends ``op`` (``PartitionFlight._send``)."""
    return grouped.take_rounds(op, flight.s.group_partitions, flight.stages)


def job(t, lr):
    return PushPull(t, np.zeros(t.count, np.float32), np.zeros(t.count, np.float32), 1, Future("test"),
                    len(t.keys), lr)


def test_asked_once_per_job_and_only_with_the_setting_a_codec_and_several_partitions():
    flight, stages, t = setup()
    a = job(t, 0.1)
    assert together(flight, PartitionOp(a, t.keys[0]))
    assert not together(flight, PartitionOp(a, t.keys[1])), "asked again for the same job"
    for off in (setup(group=False), setup(spec=None), setup(parts=(8,))):
        flight, _, t = off
        assert not together(flight, PartitionOp(job(t, 0.1), t.keys[0]))


def test_not_while_a_partition_of_the_tensor_is_busy_or_reduced_locally():
    for busy in ("in_flight", "held", "compressed_by", "via", "pushers"):
        flight, _, t = setup()
        setattr(t.keys[2], busy, {"held": [object()], "via": 1, "pushers": 2}.get(busy, object()))
        assert not together(flight, PartitionOp(job(t, 0.1), t.keys[0])), busy


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


class OffThread(Stages):
    """The encoders run on a real host-copies thread (as a CUDA tensor's do), the first one
    held until the test lets it go; ``refuse`` makes every key-by-key compress refuse."""

    def __init__(self, refuse: bool = False):
        super().__init__()
        self.wakes = threading.Semaphore(0)
        self.host_copies = HostCopies(self.wakes.release)
        self.go, self.refuse, self.threads, self.headers = threading.Event(), refuse, set(), []

    @staticmethod
    def encodes_on_device(op):
        return not (op.job.compressed and op.wkey.key in op.job.compressed)

    def compress_tensor(self, job, rounds):
        assert self.go.wait(30), "the test never let the encoder go"
        super().compress_tensor(job, rounds)

    def compress(self, op):
        self.threads.add(threading.current_thread().name)
        early = op.job.early_payload(op.wkey, op.round)
        if self.refuse and early is None:
            raise ValueError("the input holds NaN or inf")
        return early if early is not None else ({"late": True}, [])

    def send(self, op, payload):
        super().send(op, payload)
        self.headers.append(payload[0])

    def finished(self, n):
        assert all(self.wakes.acquire(timeout=30) for _ in range(n)), "an encoder never finished"
        self.host_copies.run_finished()


def test_while_encoders_run_off_this_thread_a_later_job_takes_no_key_and_each_push_follows_its_encoder():
    flight, _, t = setup()
    stages = flight.stages = OffThread()
    a, b = job(t, 0.1), job(t, 0.2)
    flight.start(a, priority=0)
    flight._queue.take()
    flight._queue.release()
    flight._send(PartitionOp(a, t.keys[0]))
    flight.start(b, priority=100)  # b first by priority, while a's encoder has not run yet
    flight.dispatch()
    assert stages.pushed == [] and stages.together == [], "pushed before its encoder ran"
    stages.go.set()
    stages.finished(3)
    assert sorted(stages.pushed) == [(0, 0, 0.1, True), (1, 0, 0.1, True), (2, 0, 0.1, True)], \
        f"a key's round 0 went to the later job: {stages.pushed}"
    assert stages.threads == {"gp-host-copies"}
    assert all(wk.compressed_by is None for wk in t.keys) and all(wk.held for wk in t.keys)
    stages.host_copies.close(5)


def test_a_round_refused_off_this_thread_fails_its_job_and_goes_out_refused_and_a_failed_one_never_goes():
    flight, _, t = setup(parts=(4,))
    stages = flight.stages = OffThread(refuse=True)
    a = job(t, 0.1)
    flight._send(PartitionOp(a, t.keys[0]))
    stages.finished(1)
    assert stages.pushed == [(0, 0, 0.1, True)] and stages.headers == [{"refused": "the input holds NaN or inf"}]
    with pytest.raises(JobError, match="tensor 't': the input holds NaN or inf"):
        a.future.result(0)
    t.keys[0].in_flight = None
    b = job(t, 0.1)
    flight._send(PartitionOp(b, t.keys[0]))
    t.keys[0].in_flight = None  # its deadline passed while its encoder ran
    stages.finished(1)
    assert stages.pushed == [(0, 0, 0.1, True)], "a failed round went out"
    stages.host_copies.close(5)


def test_a_round_whose_encoder_never_finishes_fails_at_its_deadline_naming_the_gpu_and_goes_out_refused():
    # refused, so that the server's round ends for every worker, as a CPU worker's late push ends it
    flight, _, t = setup(parts=(4,))
    stages = flight.stages = OffThread()
    stages.compress = lambda op: stages.go.wait(30) and ({"late": True}, [])  # a GPU that hangs
    a = job(t, 0.1)
    op = PartitionOp(a, t.keys[0])
    flight._send(op)
    flight._expire(op)
    never = "round 0, never sent: its copy off the GPU, or its encoder there, did not finish"
    with pytest.raises(OpTimeoutError, match=never):
        a.future.result(0)
    assert stages.pushed == [(0, 0, 0.1, True)] and never in stages.headers[0]["refused"]
    assert t.keys[0].in_flight is None, "the key is not free for its next round"
    stages.go.set()
    stages.finished(1)
    assert len(stages.pushed) == 1, "the payload went out after the refusal"
    stages.host_copies.close(5)


@pytest.mark.parametrize("parts", [(4,), (4, 4, 2)])
def test_an_encoder_that_fails_on_the_gpu_fails_its_job_naming_the_tensor_and_every_round_goes_out_refused(parts):
    # out of memory, or another CUDA error, in a key-by-key or a grouped compress: the
    # communication thread goes on, and the servers' rounds stay in step with the other workers
    flight, _, t = setup(parts=parts)
    stages = flight.stages = OffThread()
    stages.go.set()

    def out_of_memory(*_):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB")
    stages.compress_tensor = stages.compress = out_of_memory
    a = job(t, 0.1)
    flight.start(a, priority=0)
    flight.dispatch()
    stages.finished(len(parts))
    assert sorted(stages.pushed) == [(i, 0, 0.1, True) for i in range(len(parts))]
    reason = "its encoder failed on the GPU: RuntimeError: CUDA out of memory. Tried to allocate 2.00 MiB"
    assert stages.headers == [{"refused": reason}] * len(parts)
    with pytest.raises(JobError, match=f"tensor 't': {reason}"):
        a.future.result(0)
    stages.host_copies.close(5)


def _out_of_memory(*_):
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB")


def _grouped_encode_failing(credit: int = 64):
    """A flight of a 3-partition tensor whose grouped encode fails on the GPU (its encoders
    on the host-copies thread), ``credit`` partitions on the wire at a time."""
    flight, _, t = setup(parts=(4, 4, 2))
    stages = flight.stages = OffThread()
    stages.go.set()
    stages.compress_tensor = _out_of_memory
    flight._queue = type(flight._queue)(credit)
    return flight, stages, t


def _rounds_end_one_by_one(flight, t) -> None:
    """Each round in flight ends (its reply came), and each end gives the credit to the next partition."""
    for _ in range(len(t.keys)):
        for wk in t.keys:
            if wk.in_flight is not None:
                flight._leave_flight(wk.in_flight)
        flight.dispatch()


def _pushed_by(flight, stages, t, b) -> list[int]:
    """The partitions of job ``b`` that went out, once the encoders it started are done."""
    flight.dispatch()
    started = sum(1 for wk in t.keys if wk.in_flight is not None and wk.in_flight.job is b)
    if started:
        stages.finished(started)
    return sorted(i for i, _, lr, _ in stages.pushed if lr == b.lr)


def _failed_grouped(flight, stages, t, encodes: int) -> None:
    """A job of ``t`` started, its grouped encode failed after ``encodes`` finished."""
    a = job(t, 0.1)
    flight.start(a, priority=0)
    flight.dispatch()
    stages.finished(encodes)
    with pytest.raises(JobError):
        a.future.result(0)


def test_after_a_grouped_encode_failed_on_the_gpu_the_next_job_sends_every_partition():
    # the grouped launch fails before the first key's payload is taken: that key kept the
    # failed job's mark, and the next job's partition was held behind it for good
    flight, stages, t = _grouped_encode_failing()
    _failed_grouped(flight, stages, t, encodes=3)
    for wk in t.keys:  # the servers' refusals of the round end it, key by key
        if wk.in_flight is not None:
            flight._leave_flight(wk.in_flight)
    b = job(t, 0.2)
    flight.start(b, priority=0)
    assert _pushed_by(flight, stages, t, b) == [0, 1, 2], [len(wk.held) for wk in t.keys]
    stages.host_copies.close(5)


def test_after_a_grouped_encode_outlived_its_rounds_the_next_job_sends_every_partition():
    # the next job's partitions wait behind the slow encode's marks; once it ends, with no
    # round of those keys out, nothing else would queue them again
    flight, _, t = setup(parts=(4, 4, 2))
    stages = flight.stages = OffThread()   # the grouped encode waits for stages.go (a slow GPU)
    a = job(t, 0.1)
    flight.start(a, priority=0)
    flight.dispatch()
    for wk in t.keys:                      # every deadline passes while it runs
        if wk.in_flight is not None:
            flight._expire(wk.in_flight)
    b = job(t, 0.2)
    flight.start(b, priority=0)
    flight.dispatch()
    assert all(wk.held for wk in t.keys), "the next job's partitions went before the slow encode ended"
    stages.go.set()
    stages.finished(3)
    assert _pushed_by(flight, stages, t, b) == [0, 1, 2], [len(wk.held) for wk in t.keys]
    stages.host_copies.close(5)


class _RecordsReads:
    """Stages whose encoder records each partition it read (its source) and makes a payload."""

    def __init__(self):
        super().__init__()
        self.read = []

    def compress(self, op):
        self.read.append(op.wkey.index)
        return ({"made": True}, [])


def test_a_failed_push_pulls_partitions_still_queued_go_out_refused_without_reading_their_source():
    # the caller was told at the first failure and may reuse its tensor (a CUDA one's consumer
    # waited only for what was queued by then): later partitions must not read it
    class Reads(_RecordsReads, Stages):
        def __init__(self):
            super().__init__()
            self.headers = []

        def compress(self, op):
            made = super().compress(op)
            if op.wkey.index == 0:
                raise ValueError("the input holds NaN or inf")
            return made

        def send(self, op, payload):
            super().send(op, payload)
            self.headers.append(payload[0])
    flight, _, t = setup(group=False)
    stages = flight.stages = Reads()
    flight._queue = type(flight._queue)(1)   # one partition on the wire at a time
    a = job(t, 0.1)
    flight.start(a, priority=0)
    flight.dispatch()
    assert a.future.done() and stages.read == [0]
    _rounds_end_one_by_one(flight, t)
    assert stages.read == [0], f"partitions {stages.read[1:]} read their source after the job failed"
    assert [i for i, *_ in stages.pushed] == [0, 1, 2]   # every round still reaches the servers
    assert all("refused" in h for h in stages.headers[1:]), stages.headers


def test_after_a_grouped_encode_failed_with_partitions_past_the_credit_the_next_job_sends_every_partition():
    # the partitions dispatched after the failure go out refused, unread: the marks the failed
    # grouped encode left on their keys go with them, else the tensor's next push_pulls waited
    # behind those marks for good
    flight, stages, t = _grouped_encode_failing(credit=1)   # one partition on the wire at a time
    _failed_grouped(flight, stages, t, encodes=1)
    _rounds_end_one_by_one(flight, t)   # the later partitions go out refused
    assert [i for i, *_ in stages.pushed] == [0, 1, 2] and all("refused" in h for h in stages.headers)
    assert [wk.compressed_by for wk in t.keys] == [None] * 3, "a failed job's marks are left"
    del stages.compress_tensor
    flight._queue = type(flight._queue)(64)
    b = job(t, 0.2)
    flight.start(b, priority=0)
    assert _pushed_by(flight, stages, t, b) == [0, 1, 2], [len(wk.held) for wk in t.keys]
    stages.host_copies.close(5)


def test_encoders_queued_when_their_push_pull_fails_do_not_read_its_tensor():
    # a landing failure (or a refusal) fails the job while its partitions' encoders wait on the
    # host-copies thread: the caller, told, may rewrite the tensor, so they refuse unread
    class Reads(_RecordsReads, OffThread):
        pass
    flight, _, t = setup(group=False)
    stages = flight.stages = Reads()
    gate = threading.Event()
    stages.host_copies.run(lambda: gate.wait(30), lambda _: None)   # the encoders queue behind it
    a = job(t, 0.1)
    flight.start(a, priority=0)
    flight.dispatch()
    a.future.fail(JobError("push_pull of tensor 't': landing failed for key 65536"))
    gate.set()
    stages.finished(1 + len(t.keys))
    assert stages.read == [], f"partitions {stages.read} read their tensor after its push_pull failed"
    assert [i for i, *_ in stages.pushed] == [0, 1, 2]   # every round still reaches the servers
    assert all("failed before this partition went" in h["refused"] for h in stages.headers), stages.headers
    stages.host_copies.close(5)
