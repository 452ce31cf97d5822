"""A worker that finished while others go on (Op.LEFT, synchronous jobs): its rounds all
completed first, so a round still open never will. Everyone in one hears why at once, and
so does every later push or pull of a round not complete; a completed round's pull and
reads of server state (a checkpoint after the last step) are still served. The scheduler's
barriers fail the same way."""
import numpy as np

from gradpress.net import protocol
from gradpress.net.protocol import Op
from gradpress.scheduler.barriers import Barriers
from gradpress.scheduler.roster import Member
from gradpress.server.engine import Engine
from gradpress.trace import Tracer

WHY = "worker 2 finished (shutdown, or its script ended) while other workers go on"


def _header(op, **fields):
    return protocol.decode(protocol.encode(op, "worker 0", **fields))


def _push(engine, who: bytes, key: int, rnd: int, pull: bool = False):
    return engine._handle(who, _header(Op.PUSH, key=key, round=rnd, dtype="float32", count=2,
                                       **({"pull": True} if pull else {})), [np.ones(2, np.float32).tobytes()])


def test_open_rounds_fail_at_once_and_later_ones_are_refused_naming_the_worker_that_left():
    engine = Engine(0, None, "inproc://unused", "inproc://unused", "server 0", num_workers=3, async_mode=False,
                    tracer=Tracer(""))
    workers = [b"w0", b"w1", b"w2"]
    for key in (3, 4):
        for w in workers:
            assert engine._handle(w, _header(Op.INIT_KEY, key=key, name=f"t{key}", count=2, dtype="float32"), []) == []
        for w in workers:  # round 0 of both keys: worker 2 took part, and got its sum
            _push(engine, w, key, 0, pull=True)
    _push(engine, b"w0", 3, 1, pull=True)  # key 3's round 1: two of three pushes, waiting for worker 2's
    _push(engine, b"w1", 3, 1)
    _push(engine, b"w1", 3, 2)  # an early push of round 2
    replies = engine._handle(b"", _header(Op.LEFT, rank=2, reason=WHY), [])
    errors = {(r.to, r.fields["round"]) for r in replies if r.op == Op.ERROR and WHY in r.fields["message"]}
    assert errors == {(b"w0", 1), (b"w1", 1), (b"w1", 2)} and len(replies) == 3, replies
    (refused,) = [r for r in _push(engine, b"w0", 4, 1, pull=True) if r.op == Op.ERROR]
    assert WHY in refused.fields["message"] and "round 1" in refused.fields["message"]
    (refused,) = engine._handle(b"w0", _header(Op.PULL, key=4, round=1), [])
    assert refused.op == Op.ERROR and WHY in refused.fields["message"]
    (done,) = engine._handle(b"w0", _header(Op.PULL, key=4, round=0), [])  # a completed round: answered
    assert done.op == Op.PULL_REPLY and np.frombuffer(done.buffers[0], np.float32).tolist() == [3, 3]
    (state,) = engine._handle(b"w0", _header(Op.STATE_GET, key=4), [])
    assert state.op == Op.STATE


def _member(identity: bytes, rank: int, role: str = "worker") -> Member:
    return Member(identity, role, "127.0.0.1", 0, rank, 0, 1, 100 + rank, rank=rank)


def test_a_barrier_the_finished_worker_never_reaches_fails_for_those_waiting_and_those_to_come():
    members = [_member(b"w0", 0), _member(b"w1", 1), _member(b"w2", 2), _member(b"s0", 0, "server")]
    barriers = Barriers()
    assert barriers.arrive(members[0], "worker", 1, members) == []
    assert barriers.arrive(members[3], "server", 1, members) == [([b"s0"], Op.BARRIER_DONE,
                                                                  {"group": "server", "seq": 1})]
    assert barriers.leave(members[2], WHY) == [([b"w0"], Op.ERROR, {"message": WHY, "group": "worker", "seq": 1})]
    assert barriers.arrive(members[1], "worker", 2, members) == [([b"w1"], Op.ERROR,
                                                                  {"message": WHY, "group": "worker", "seq": 2})]
    assert barriers.arrive(members[3], "server", 2, members)[0][1] == Op.BARRIER_DONE, "servers' barriers go on"


def test_a_declaration_the_finished_worker_never_made_fails_now_and_later_and_async_servers_ignore_it():
    from gradpress.placement import KeyPlacement
    from gradpress.scheduler.declarations import Declarations
    d = Declarations(3, KeyPlacement(1), timeout_s=300)
    for w in (0, 1, 2):  # every worker declared it: it stays answered
        done = d.declare(b"w%d" % w, w, "all", 4, "float32", [4], now=0)
    assert done[0][1] == Op.DECLARED
    assert d.declare(b"w0", 0, "new", 4, "float32", [4], now=0) == []
    assert d.leave(2, WHY) == [([b"w0"], Op.ERROR, {"name": "new", "message": f"tensor 'new': {WHY}"})]
    [(to, op, fields)] = d.declare(b"w1", 1, "later", 4, "float32", [4], now=1)
    assert (to, op, fields["message"]) == ([b"w1"], Op.ERROR, f"tensor 'later': {WHY}")
    assert d.declare(b"w1", 1, "all", 4, "float32", [4], now=1)[0][1] == Op.DECLARED, "a re-declaration"

    engine = Engine(0, None, "inproc://unused", "inproc://unused", "server 0", num_workers=2, async_mode=True,
                    tracer=Tracer(""))
    assert engine._handle(b"", _header(Op.LEFT, rank=1, reason=WHY), []) == [] and not engine.left
