"""What a buggy job member tells a worker (tests/support/fake_peers.py plays them): a reply
for a key from a server that does not hold it, a tensor id the scheduler already gave
another tensor, a placement of the wrong length, a server state of the wrong size, an
address book that does not add up. Each is refused naming what was wrong; none lands in a
tensor as its sum."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from gradpress.compressors.spec import CodecSpec
from gradpress.errors import JobError
from gradpress.net.node import address_book
from gradpress.net.protocol import Op


def _reply(peers, server, identity, push, value):
    peers.reply_from(server, identity, Op.PULL_REPLY, [np.full(4, value, np.float32)], key=push["key"],
                     round=push["round"], dtype="float32", count=4)


def test_a_reply_from_a_server_that_does_not_hold_the_key_is_dropped(peers, calls):
    # before: server 1's reply for server 0's key landed as the sum, and the job went on
    peers.start_client()
    out = np.zeros(4, np.float32)
    fut, identity, push = peers.first_push(calls, np.ones(4, np.float32), out)
    peers.reply_from(1, identity, Op.PUSH_ACK, key=push["key"], round=0)
    peers.reply_from(1, identity, Op.ERROR, key=push["key"], message="not mine to fail")
    _reply(peers, 1, identity, push, 42.0)
    _reply(peers, 0, identity, push, 2.0)
    fut.result(10).result(10)
    assert out.tolist() == [2.0] * 4


def test_a_tensor_id_already_given_and_a_placement_of_the_wrong_length_fail_the_tensor(peers, calls):
    # before: the second tensor took the first one's keys (its sums landed in the other's
    # output), and a short placement left partitions without keys and the push_pull waiting
    client = peers.start_client(partition_bytes=16)
    a, b, c = (np.ones(4, np.float32) for _ in range(3))
    first = calls.submit(lambda: client.push_pull_async("a", a, a, 1, 0))
    peers.declare("a", tensor_id=7, servers=[0])
    second = calls.submit(lambda: client.push_pull_async("b", b, b, 1, 0))
    peers.declare("b", tensor_id=7, servers=[1])
    with pytest.raises(JobError, match="tensor 'b': the scheduler gave it id 7, which is .* another tensor's"):
        second.result(10).result(10)
    third = calls.submit(lambda: client.push_pull_async("c", np.ones(8, np.float32), c, 1, 0))
    peers.declare("c", tensor_id=8, servers=[0])  # two partitions of 16 bytes, one server named
    with pytest.raises(JobError, match=r"tensor 'c': the scheduler placed its 2 partition\(s\) on servers \[0\]"):
        third.result(10).result(10)
    assert not first.result(10).done(), "tensor a's push_pull was touched"


def test_a_server_state_of_the_wrong_size_fails_the_read_naming_the_server(peers, calls):
    # before: the communication thread died of numpy's error (4n+2 bytes), or the state was kept
    client = peers.start_client()
    codec = CodecSpec.from_params({"compressor": "onebit", "ef": "vanilla"})
    declared = calls.submit(lambda: client.declare("g", 4, "float32", codec))
    peers.declare("g", tensor_id=5, servers=[1])
    declared.result(10)
    for frame in (np.ones(2, np.float32).tobytes(), b"\0" * 18):
        got = calls.submit(client.server_state, "g")
        identity, h, _ = peers.from_worker_at(1)
        peers.reply_from(1, identity, Op.STATE, [frame], key=h["key"], lr=0.1)
        with pytest.raises(JobError, match=rf"server 1: the server state of tensor 'g'.* \[{len(frame)}\] bytes"):
            got.result(10)
    assert not client.comm.stopped.is_set()


GOOD_BOOK = {"rank": 1, "num_workers": 2, "num_servers": 1, "local_size": 1, "nodes": [
    {"role": "worker", "rank": 0, "host": "h", "port": 0}, {"role": "worker", "rank": 1, "host": "h", "port": 0},
    {"role": "server", "rank": 0, "host": "h", "port": 9000, "ports": [9000, 9001]}]}


@pytest.mark.parametrize("change, message", [
    (lambda b: b.update(num_workers=0), r"worker ranks \[0, 1\] for num_workers=0"),
    (lambda b: b.update(num_workers=3), r"worker ranks \[0, 1\] for num_workers=3"),
    (lambda b: b["nodes"][1].update(rank=0), r"worker ranks \[0, 0\]"),
    (lambda b: b.update(num_servers=2), r"server ranks \[0\] for num_servers=2"),
    (lambda b: b["nodes"][2].update(ports=[9000, 70000]), "out of range"),
    (lambda b: b["nodes"][0].pop("rank"), "malformed node"),
    (lambda b: b.update(rank=5), "rank 5 is not among them"),
    (lambda b: b.update(local_size=3), "local_size=3 for 2 workers"),
])
def test_an_address_book_that_does_not_add_up_is_refused(change, message):
    # before: num_workers=0 was taken (averages divided by 0), a node without a rank a KeyError
    assert address_book(GOOD_BOOK, "worker").num_workers == 2
    book = copy.deepcopy(GOOD_BOOK)
    change(book)
    with pytest.raises(JobError, match=f"worker: the scheduler's address book .*{message}"):
        address_book(book, "worker")
