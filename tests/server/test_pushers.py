"""INIT_KEY's ``pushers``: a key whose workers reduce locally completes a round with one push
per machine; a count the job cannot have, or one that contradicts the key's, is refused."""
import numpy as np

from gradpress.net import protocol
from gradpress.net.protocol import Op
from gradpress.server.engine import Engine
from gradpress.trace import Tracer


def _header(op, **fields):
    return protocol.decode(protocol.encode(op, "worker 0", **fields))


def _engine(num_workers: int) -> Engine:  # never started: _handle is called on this thread
    return Engine(0, None, "inproc://unused", "inproc://unused", "server 0", num_workers=num_workers,
                  async_mode=False, tracer=Tracer(""))


def _init(engine, who: bytes, **extra):
    return engine._handle(who, _header(Op.INIT_KEY, key=3, name="t", count=2, dtype="float32", **extra), [])


def _push(engine, who: bytes, values):
    return engine._handle(who, _header(Op.PUSH, key=3, round=0, dtype="float32", count=2),
                          [np.asarray(values, np.float32).tobytes()])


def test_a_round_of_a_locally_reduced_key_completes_with_one_push_per_machine():
    engine = _engine(num_workers=6)
    assert _init(engine, b"m0", pushers=2) == [] and _init(engine, b"m1", pushers=2) == []
    _push(engine, b"m0", [1, 2])
    assert engine._handle(b"m0", _header(Op.PULL, key=3, round=0), []) == [], "one push of two completed the round"
    replies = _push(engine, b"m1", [10, 20])
    pulled = [r for r in replies if r.op == Op.PULL_REPLY]
    assert len(pulled) == 1 and np.frombuffer(pulled[0].buffers[0], np.float32).tolist() == [11, 22]


def test_pushers_the_job_cannot_have_or_that_contradict_the_key_are_refused():
    engine = _engine(num_workers=4)
    (error,) = _init(engine, b"m0", pushers=5)
    assert error.op == Op.ERROR and "5 pushes a round" in error.fields["message"], error
    assert _init(engine, b"m0", pushers=2) == []
    (error,) = _init(engine, b"w1")  # a worker that pushes on its own: every worker's push would count
    assert error.op == Op.ERROR and "GRADPRESS_LOCAL_REDUCE" in error.fields["message"], error
