"""The owner's relay (local reduction) on its own: a real key table's key, the group's
sockets replaced by a recorder. A peer whose push_pull failed before a partition went
pushes that round refused, without values: the machine's round fails at once, naming the
peer and why, where the owner used to answer it an error and wait out its deadline. And, on
real sockets, a peer that reads nothing never blocks the owner's sends."""
from types import SimpleNamespace

import numpy as np

from gradpress.net.protocol import Op
from gradpress.worker.future import Future
from gradpress.worker.jobs import PartitionOp, PushPull
from gradpress.worker.keys import KeyTable, Tensor
from gradpress.worker.relay import Relay


class Flight:
    def __init__(self):
        self.failed, self.summed = [], []

    def push_summed(self, op):
        self.summed.append(op.summed.copy())

    def fail_local(self, op, message):
        self.failed.append(message)


def _relay():
    table = KeyTable()
    t = Tensor("t", 4, "float32", 1, [4], [0], None)
    table.add(t, 1)
    group = SimpleNamespace(base_rank=2, size=3, me=0, router=None)
    flight = Flight()
    relay = Relay(group, "worker 2", None, flight, host_copies=None)
    sent = []
    relay._send = lambda identity, op, buffers=(), **fields: sent.append((identity, op, fields))
    wk = t.keys[0]
    op = PartitionOp(PushPull(t, np.ones(4, np.float32), np.empty(4, np.float32), 3, Future("test"), 1), wk)
    op.round = 0
    return relay, flight, sent, wk, op


def _push(relay, wk, j, **fields):
    h = {"op": Op.PUSH, "key": wk.key, "round": 0, "dtype": "float32", "count": 4, "pull": True, **fields}
    frames = [] if "refused" in fields else [SimpleNamespace(buffer=np.full(4, j, np.float32).tobytes())]
    relay._from_peer(f"local {2 + j}".encode(), j, h, frames)


def test_a_peers_refused_push_fails_the_machines_round_naming_the_peer():
    relay, flight, sent, wk, op = _relay()
    _push(relay, wk, 1, refused="its push_pull of tensor 't' failed before this partition went")
    assert [(op_, f.get("round")) for _, op_, f in sent] == [(Op.PUSH_ACK, 0)], "refused push not taken"
    relay.contribute(op)
    _push(relay, wk, 2)
    assert flight.summed == [] and len(flight.failed) == 1, (flight.summed, flight.failed)
    assert "worker 3 refused its push: its push_pull of tensor 't' failed" in flight.failed[0]


def test_a_peers_push_after_the_owners_round_failed_sums_nothing():
    relay, flight, sent, wk, op = _relay()
    relay.contribute(op)
    relay.fail(wk.key, 0, "push_pull of tensor 't': round 0, waiting for the local push of worker(s) [3, 4]")
    _push(relay, wk, 1)
    _push(relay, wk, 2)
    assert flight.summed == [] and flight.failed == []
    assert [op_ for _, op_, _ in sent] == [Op.PUSH_ACK, Op.ERROR] * 2   # each pull hears why


def test_an_owner_whose_push_pull_failed_while_the_pushes_came_in_does_not_read_its_tensor():
    relay, flight, sent, wk, op = _relay()
    relay.contribute(op)
    op.job.future.fail(RuntimeError("its push_pull failed: a landing"))
    _push(relay, wk, 1)
    _push(relay, wk, 2)
    assert flight.summed == [] and len(flight.failed) == 1 and "failed before the machine's sum" in flight.failed[0]



def test_a_servers_word_on_a_round_held_up_reaches_the_peers_waiting_and_is_not_kept_as_its_reply():
    # servers/waits.py's STALLED: before, only the owner heard it, and its peers' deadline
    # errors named only the owner
    relay, flight, sent, wk, op = _relay()
    relay.contribute(op)
    _push(relay, wk, 1)
    word = {"op": Op.STALLED, "from": "server 0", "v": 1, "key": wk.key, "round": 0,
            "message": "server 0 waits for the push of machine 0 (workers 0-2) (at 5 s it had worker 2's)"}
    relay.tell(wk.key, 0, Op.STALLED, word)
    told = [(who, f) for who, o, f in sent if o == Op.STALLED]
    assert told == [(b"local 3", {"key": wk.key, "round": 0, "message": word["message"]})], sent
    _push(relay, wk, 2)  # the last peer's pull comes after: it is not told, and the round's reply is still to come
    assert [o for _, o, _ in sent].count(Op.STALLED) == 1 and len(flight.summed) == 1

def test_fields_a_servers_message_adds_are_not_passed_on_as_the_send_calls_keywords():
    # a STALLED or PULL_REPLY header with a field named as one of the send's parameters
    # ("identity", "buffers") raised TypeError on the owner's communication thread: the worker died
    relay, flight, sent, wk, op = _relay()
    relay.contribute(op)
    _push(relay, wk, 1)
    extra = {"identity": 0, "buffers": 7, "sender": "x", "nonblocking": 1, "future": "?"}
    word = {"op": Op.STALLED, "from": "server 0", "v": 1, "key": wk.key, "round": 0, "message": "m", **extra}
    relay.tell(wk.key, 0, Op.STALLED, word)
    reply = {"op": Op.PULL_REPLY, "from": "server 0", "v": 1, "key": wk.key, "round": 0, "dtype": "float32",
             "count": 4, **extra}
    relay.relay(wk.key, 0, Op.PULL_REPLY, reply, [np.zeros(4, np.float32)])
    assert [(o, f) for _, o, f in sent if o != Op.PUSH_ACK] == [
        (Op.STALLED, {"key": wk.key, "round": 0, "message": "m"}),
        (Op.PULL_REPLY, {"key": wk.key, "round": 0, "dtype": "float32", "count": 4})], sent


def test_an_owner_never_blocks_on_a_peer_that_reads_nothing():
    """A stopped peer (SIGSTOP) whose queue is full: the owner's sends to it are dropped, not
    waited on, so its thread (heartbeats, every other key) goes on."""
    import threading

    import zmq
    ctx = zmq.Context.instance()
    router, peer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        for sock in (router, peer):
            sock.setsockopt(zmq.SNDHWM, 2)
            sock.setsockopt(zmq.RCVHWM, 2)
            sock.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        peer.setsockopt(zmq.IDENTITY, b"local 3")
        peer.connect(f"tcp://127.0.0.1:{port}")
        peer.send(b"hello")  # the router learns the peer's identity
        router.recv_multipart()
        relay = Relay(SimpleNamespace(base_rank=2, size=3, me=0, router=router), "worker 2", None, Flight(),
                      host_copies=None)
        big, failed = np.zeros(1 << 18, np.float32), []  # 1 MiB a message, 64 of them: past the TCP buffers too

        def send_many() -> None:
            try:
                for r in range(64):
                    relay._send(b"local 3", Op.PULL_REPLY, [big], key=1, round=r, dtype="float32", count=big.size)
            except BaseException as e:  # noqa: BLE001 - the test reports it
                failed.append(e)
        sender = threading.Thread(target=send_many, daemon=True)
        sender.start()
        sender.join(20)
        assert not failed, failed
        assert not sender.is_alive(), "the owner blocked on a peer that reads nothing"
    finally:
        router.close()
        peer.close()
