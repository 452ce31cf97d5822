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
