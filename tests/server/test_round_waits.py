"""A round held up by a worker: once it has waited half of GRADPRESS_OP_TIMEOUT_S, its server
names the workers whose push it still waits for, once, to every worker in the round (Op.STALLED),
and a waiting worker's deadline error quotes it. Before, the error named only the server, and
the job blamed the worker that waited, not the one that never pushed."""
import numpy as np
import pytest

from gradpress.net import protocol
from gradpress.net.protocol import Op
from gradpress.server.engine import Engine
from gradpress.trace import Tracer

AFTER_S = 5.0


def _engine(num_workers=3, async_mode=False):
    return Engine(0, None, "inproc://unused", "inproc://unused", "server 0", num_workers=num_workers,
                  async_mode=async_mode, tracer=Tracer(""), stalled_after_s=AFTER_S)


def _header(op, sender="worker 0", **fields):
    return protocol.decode(protocol.encode(op, sender, **fields))


def _init(engine, key, workers, **extra):
    for rank, w in workers.items():
        assert engine._handle(w, _header(Op.INIT_KEY, f"worker {rank}", key=key, name=f"t{key}", count=2,
                                         dtype="float32", **extra), []) == []


def _push(engine, who: bytes, key: int, rnd: int, pull: bool = False):
    return engine._handle(who, _header(Op.PUSH, key=key, round=rnd, dtype="float32", count=2,
                                       **({"pull": True} if pull else {})), [np.ones(2, np.float32).tobytes()])


def _stalled(replies):
    return {(r.to, r.fields["key"], r.fields["round"]): r.fields["message"] for r in replies if r.op == Op.STALLED}


def test_a_round_waiting_on_a_worker_names_it_once_to_everyone_in_the_round():
    engine = _engine()
    workers = {0: b"w0", 1: b"w1", 2: b"w2"}
    _init(engine, 3, workers)
    _init(engine, 4, workers)
    _push(engine, b"w0", 3, 0, pull=True)
    _push(engine, b"w2", 3, 0)
    _push(engine, b"w2", 3, 1)  # worker 2 went on to round 1 early
    for w in workers.values():  # key 4's round completes: nothing to say of it
        _push(engine, w, 4, 0)
    assert engine.waits.check(engine.keys, 100.0) == []  # first seen open now
    assert engine.waits.check(engine.keys, 100.0 + AFTER_S - 0.5) == []
    said = _stalled(engine.waits.check(engine.keys, 100.0 + AFTER_S))
    assert set(said) == {(b"w0", 3, 0), (b"w2", 3, 0), (b"w2", 3, 1)}, said
    assert said[(b"w0", 3, 0)] == "server 0 waits for the push of worker 1 (at 5 s it had worker 0, worker 2's)"
    assert engine.waits.check(engine.keys, 100.0 + 3 * AFTER_S) == []  # once a round
    _push(engine, b"w1", 3, 0)  # round 0 completes; round 1 (worker 2's early push) is open now
    assert engine.waits.check(engine.keys, 200.0) == []
    said = _stalled(engine.waits.check(engine.keys, 200.0 + AFTER_S))
    assert set(said) == {(b"w2", 3, 1)}
    assert "push of worker 0, worker 1 (at 5 s it had worker 2's)" in said[(b"w2", 3, 1)]


def test_a_pull_waiting_for_a_round_nobody_pushed_and_a_push_per_machine():
    engine = _engine(num_workers=6)
    _init(engine, 5, {2: b"w2"}, pushers=3)  # one push a machine (GRADPRESS_LOCAL_REDUCE): 3 machines of 2
    _push(engine, b"w2", 5, 0, pull=True)  # worker 2 pushes machine 1's sum
    engine.waits.check(engine.keys, 0.0)
    (said,) = _stalled(engine.waits.check(engine.keys, AFTER_S)).values()
    assert said == "server 0 waits for the push of machine 0 (workers 0-1), machine 2 (workers 4-5) (at 5 s it " \
                   "had worker 2's)"
    engine = _engine(num_workers=2)
    _init(engine, 6, {0: b"w0", 1: b"w1"})
    assert engine._handle(b"w0", _header(Op.PULL, key=6, round=0), []) == []  # waits for round 0
    engine.waits.check(engine.keys, 0.0)
    (said,) = _stalled(engine.waits.check(engine.keys, AFTER_S)).values()
    assert said == "server 0 waits for the push of worker 0, worker 1 (at 5 s it had no push yet)"


def test_a_name_no_rank_can_be_read_from_leaves_the_key_working_and_unnamed():
    # a peer's INIT_KEY named "worker ²" (str.isdigit, but not int's) broke the key for everyone
    engine = _engine(num_workers=2)
    _init(engine, 3, {0: b"w0", 1: b"w1"})
    for odd in ("worker \u00b2", "worker " + "9" * 5000, "server 0"):
        assert engine._handle(b"w9", _header(Op.INIT_KEY, odd, key=3, name="t3", count=2, dtype="float32"), []) == []
    _push(engine, b"w0", 3, 0)
    assert [r.op for r in _push(engine, b"w1", 3, 0)] == [Op.PUSH_ACK]


def test_a_key_released_and_made_again_starts_its_own_wait():
    engine = _engine(num_workers=2)
    _init(engine, 3, {0: b"w0", 1: b"w1"})
    _push(engine, b"w0", 3, 0)
    engine.waits.check(engine.keys, 0.0)
    engine._handle(b"w0", _header(Op.RELEASE, key=3), [])
    _init(engine, 3, {0: b"w0", 1: b"w1"})
    _push(engine, b"w0", 3, 0)
    assert engine.waits.check(engine.keys, AFTER_S) == []  # first seen open now, not at 0
    assert _stalled(engine.waits.check(engine.keys, 2 * AFTER_S))


@pytest.mark.parametrize("async_mode", [False, True])
def test_nothing_is_said_in_async_jobs_or_once_a_worker_left(async_mode):
    engine = _engine(num_workers=2, async_mode=async_mode)
    _init(engine, 3, {0: b"w0", 1: b"w1"})
    if not async_mode:
        _push(engine, b"w0", 3, 0)
        engine._handle(b"", _header(Op.LEFT, "scheduler 0", rank=1, reason="worker 1 finished"), [])
    engine.waits.check(engine.keys, 0.0)
    assert engine.check_waits() == [] and engine.waits.check(engine.keys, 0.0) == []
