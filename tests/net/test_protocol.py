"""The message codec: every operation round-trips; anything malformed is a ProtocolError."""
import msgpack
import pytest

from gradpress.net import protocol
from gradpress.net.protocol import Op, ProtocolError

VALID = {
    Op.REGISTER: dict(role="worker", host="10.0.0.1", port=0, worker_id=-1, local_rank=0, local_size=1, pid=42),
    Op.ADDRESS_BOOK: dict(rank=1, nodes=[{"role": "server", "rank": 0, "host": "h", "port": 5}],
                          num_workers=2, num_servers=1),
    Op.BARRIER: dict(group="worker", seq=3),
    Op.BARRIER_DONE: dict(group="worker", seq=3),
    Op.HEARTBEAT: {},
    Op.NODE_LOST: dict(role="server", rank=0, reason="no heartbeat"),
    Op.SHUTDOWN: dict(reason="done"),
    Op.FINISH: dict(busy=True),
    Op.DECLARE: dict(name="Gradient.fc.weight", count=10, dtype="float32", parts=[6, 4]),
    Op.DECLARED: dict(name="Gradient.fc.weight", tensor_id=3, servers=[0, 1]),
    Op.INIT_KEY: dict(key=(3 << 16) | 1, name="w", count=4, dtype="float16"),
    Op.PUSH: dict(key=7, round=2, dtype="float64", count=9, codec="onebit", meta={"scale": 0.5}, lr=0.1),
    Op.PULL: dict(key=7, round=2),
    Op.PULL_REPLY: dict(key=7, round=2, dtype="float32", count=9),
    Op.ERROR: dict(message="bad", key=7, round=2, name="w"),
    Op.PUSH_ACK: dict(key=7, round=2),
    Op.STATE_GET: dict(key=7),
    Op.STATE: dict(key=7, lr=0.01),
    Op.ABORT: dict(reason="ValueError: boom", pid=4242, worker_id=1, local_rank=0),
    Op.SHUTDOWN_ACK: {},
    Op.RELEASE: dict(key=7),
    Op.LEFT: dict(rank=1, reason="worker 1 finished while other workers go on"),
    Op.STALLED: dict(key=7, round=2, message="has waited 150 s for the push of worker 1 (it has worker 0's)"),
}


def test_every_operation_has_a_round_trip_case():
    assert set(VALID) == set(Op)


@pytest.mark.parametrize("op", list(Op), ids=lambda o: o.name)
def test_round_trip(op):
    header = protocol.decode(protocol.encode(op, "worker 0", **VALID[op]))
    assert header["op"] is op and header["from"] == "worker 0"
    for k, v in VALID[op].items():
        assert header[k] == v, k


def test_an_error_can_name_the_barrier_it_concerns():
    header = protocol.decode(protocol.encode(Op.ERROR, "scheduler 0", message="m", group="all", seq=4))
    assert (header["group"], header["seq"]) == ("all", 4)


def raw(**fields):
    return msgpack.packb({"v": protocol.PROTOCOL_VERSION, "from": "x", **fields})


@pytest.mark.parametrize("frame,why", [
    (b"\xc1\xc1garbage", "not msgpack"),
    (msgpack.packb([1, 2]), "not a map"),
    (raw(op=int(Op.PUSH), key=1, round=0, dtype="float32"), "missing field 'count'"),
    (raw(op=int(Op.PUSH), key="1", round=0, dtype="float32", count=1), "field 'key' is str"),
    (raw(op=int(Op.PUSH), key=True, round=0, dtype="float32", count=1), "field 'key' is bool"),
    (raw(op=int(Op.PUSH), key=1, round=0, dtype="int8", count=1), "dtype 'int8'"),
    (raw(op=int(Op.PUSH), key=1, round=-1, dtype="float32", count=1), "round is negative"),
    (raw(op=int(Op.PUSH), key=1, round=0, dtype="float32", count=1, lr="fast"), "field 'lr' is str"),
    (raw(op=int(Op.ERROR), message="m", group="worker", seq="1"), "field 'seq' is str"),
    (raw(op=999), "unknown operation 999"),
    (msgpack.packb({"v": 99, "op": 5, "from": "x"}), "protocol version 99"),
    (msgpack.packb({"v": protocol.PROTOCOL_VERSION, "op": 5}), "missing field 'from'"),
    (b"\x00" * (protocol.MAX_HEADER_BYTES + 1), "exceeds"),
])
def test_malformed_headers_are_rejected_with_the_reason(frame, why):
    with pytest.raises(ProtocolError, match=why.replace("(", r"\(")):
        protocol.decode(frame)


def _nested(depth: int):
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_headers_nested_deeper_than_the_limit_are_refused_and_the_limit_is_taken():
    """A peer's deeply nested field would raise RecursionError where a message quotes it (a
    scheduler's refusal, a server's mismatch): refused at decoding instead."""
    deep = {"compressor": "onebit", "x": _nested(protocol.MAX_DEPTH)}  # its innermost list at depth MAX_DEPTH + 1
    frame = raw(op=int(Op.DECLARE), name="t", count=4, dtype="float32", parts=[4], compression_params=deep)
    with pytest.raises(ProtocolError, match=f"deeper than {protocol.MAX_DEPTH}"):
        protocol.decode(frame)
    frame = raw(op=int(Op.DECLARE), name="t", count=4, dtype="float32", parts=_nested(protocol.MAX_DEPTH - 1))
    assert protocol.decode(frame)["parts"] == _nested(protocol.MAX_DEPTH - 1)


def test_encoding_an_invalid_header_fails_at_the_sender():
    with pytest.raises(ProtocolError, match="missing field 'round'"):
        protocol.encode(Op.PULL, "worker 0", key=1)
