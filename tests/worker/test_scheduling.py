from gradpress.worker.scheduling import CreditQueue


def test_priority_order_and_credit():
    q = CreditQueue(credit=2)
    for item, prio in [("late-layer", -5), ("first-layer", 0), ("mid", -2), ("first-layer-2", 0)]:
        q.put(item, prio)
    assert q.take() == "first-layer" and q.take() == "first-layer-2"
    assert q.take() is None  # out of credit
    q.release()
    assert q.take() == "mid"
    q.release()
    q.release()
    assert q.take() == "late-layer" and q.take() is None  # credit is left: nothing is queued


def test_when_the_job_ends_every_partition_is_found_queued_held_or_in_flight():
    """``PartitionFlight.waiting``: the futures it fails when the job ends (a fatal error,
    or the end of the job). Queued partitions count whatever the credit: with all of it on
    the wire they were left pending, and a group of handles waited out each one's deadline."""
    from collections import deque
    from types import SimpleNamespace

    from gradpress.worker.flight import PartitionFlight
    q = CreditQueue(credit=1)
    for item, prio in [("b", 0), ("a", 5), ("c", -1)]:
        q.put(item, prio)
    assert q.take() == "a" and q.take() is None
    assert q.drain() == ["b", "c"] and q.drain() == [] and q.waiting() == []

    def op(name):
        return SimpleNamespace(job=SimpleNamespace(future=name))
    flight = PartitionFlight.__new__(PartitionFlight)
    flight._queue = CreditQueue(credit=1)
    flight._queue.in_flight = 1   # the credit is all on the wire
    flight._queue.put(op("queued"), 0)
    keys = [SimpleNamespace(in_flight=op("in flight"), held=deque([op("held 1"), op("held 2")])),
            SimpleNamespace(in_flight=None, held=deque())]
    flight.table = SimpleNamespace(values=lambda: keys)
    assert sorted(flight.waiting()) == ["held 1", "held 2", "in flight", "queued"]
