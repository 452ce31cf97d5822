"""gradpress/worker/client.py against a scripted scheduler and server (tests/support/fake_peers.py).

Each test drives one stage of the per-partition pipeline (declare, compress, push,
pull, land) or one of its rules (rounds, credit, deadlines, errors) message by message.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from gradpress.compressors.spec import CodecSpec
from gradpress.errors import JobError, OpTimeoutError, TensorMismatchError
from gradpress.net.protocol import Op
from gradpress.placement import make_key


def test_declare_asks_the_scheduler_and_keeps_its_placement(peers, calls):
    client = peers.start_client(partition_bytes=40)
    fut = calls.submit(client.declare, "w", 25, "float32")
    h = peers.declare("w", tensor_id=7, servers=[1, 0, 1])
    assert (h["count"], h["dtype"], h["parts"]) == (25, "float32", [10, 10, 5])
    t = fut.result(10)
    assert (t.tensor_id, t.servers, t.parts) == (7, [1, 0, 1], [10, 10, 5])
    assert client.declare("w", 25, "float32") is t  # a second declare asks nobody
    with pytest.raises(TensorMismatchError, match="'w' was declared with 25 float32"):
        client.declare("w", 26, "float32")


def test_a_declaration_the_scheduler_refuses_raises_a_tensor_mismatch(peers, calls):
    client = peers.start_client()
    fut = calls.submit(client.declare, "w", 4, "float32")
    peers.from_worker()
    peers.to_worker(Op.ERROR, name="w", message="tensor 'w': worker 1 declared 5 float32 elements")
    with pytest.raises(TensorMismatchError, match="worker 1 declared 5"):
        fut.result(10)


def test_a_push_pull_of_an_undeclared_tensor_returns_at_once_and_starts_once_declared(peers):
    """The caller never waits for a declaration: workers may first use tensors in different
    orders (a parameter used on one worker only), and each would wait for a name the other
    had not reached. Rounds started before the answer go out in order once it comes."""
    client = peers.start_client()
    src, out = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    first = client.push_pull_async("late", src, out, 1, 0)  # no scheduler answer yet: returns anyway
    second = client.push_pull_async("late", src, out, 1, 0)
    other = client.push_pull_async("other", src, np.zeros(4, np.float32), 1, 0)
    assert not first.done() and not second.done()
    _, h, _ = peers.from_worker()  # one DECLARE for both rounds of "late", then "other"'s
    assert (h["op"], h["name"]) == (Op.DECLARE, "late"), h
    _, h, _ = peers.from_worker()
    assert (h["op"], h["name"]) == (Op.DECLARE, "other"), h
    peers.to_worker(Op.ERROR, name="other", message="tensor 'other': worker 1 declared 5 float32 elements")
    with pytest.raises(TensorMismatchError, match="worker 1 declared 5"):
        other.result(10)
    peers.to_worker(Op.DECLARED, name="late", tensor_id=3, servers=[0])
    for rnd, fut in enumerate((first, second)):
        push = peers.serve_round(0, np.full(4, 10.0 + rnd, np.float32))
        assert push["round"] == rnd
        assert fut.result(10) is out and np.all(out == 10.0 + rnd)


def test_a_name_that_is_not_a_str_is_refused_at_the_call_and_the_worker_goes_on(peers, calls):
    client = peers.start_client()
    src, out = np.ones(4, np.float32), np.zeros(4, np.float32)
    for name in (5, None, b"bytes"):
        with pytest.raises(TypeError, match="a tensor's name must be a str, got"):
            client.push_pull_async(name, src, out, 1, 0)
    fut = calls.submit(client.declare, "after", 4, "float32")  # the communication thread lives on
    peers.declare("after", tensor_id=2, servers=[0])
    assert fut.result(10).name == "after"


def test_push_pull_inits_each_key_once_and_lands_the_average(peers, calls):
    client = peers.start_client()
    src = np.arange(6, dtype=np.float32)
    out = np.zeros_like(src)
    fut = calls.submit(lambda: client.push_pull_async("g", src, out, divisor=2, priority=0))
    peers.declare("g", tensor_id=3, servers=[1])
    push = peers.serve_round(1, np.full(6, 10.0, np.float32))
    (init, _), = peers.seen
    assert init["op"] == Op.INIT_KEY and (init["key"], init["count"], init["name"]) == (make_key(3, 0), 6, "g")
    assert (push["key"], push["round"], push["count"]) == (make_key(3, 0), 0, 6)
    assert np.frombuffer(peers.push_frames[0].buffer, np.float32).tolist() == src.tolist()
    fut.result(10).result(10)
    assert out.tolist() == [5.0] * 6

    fut = client.push_pull_async("g", src, out, divisor=1, priority=0)
    push = peers.serve_round(1, np.full(6, 3.0, np.float32))
    assert peers.seen == [] and push["round"] == 1  # no second INIT_KEY; the round moved on
    fut.result(10)
    assert out.tolist() == [3.0] * 6


def test_a_key_keeps_one_round_in_flight(peers, calls):
    client = peers.start_client()
    a, b = np.ones(4, np.float32), np.ones(4, np.float32)
    first, identity, push0 = peers.first_push(calls, a, a)
    first = first.result
    assert push0["pull"] is True  # its pull with it
    second = client.push_pull_async("g", b, b, 1, 0)
    assert peers.nothing_at(0), "round 1 went out while round 0 was in flight"
    peers.reply_from(0, identity, Op.PULL_REPLY, [np.full(4, 2.0, np.float32)], key=push0["key"], round=0,
                     dtype="float32", count=4)
    first(10).result(10)
    _, push1, _ = peers.from_worker_at(0)
    assert (push1["op"], push1["round"]) == (Op.PUSH, 1)
    assert second.done() is False


def test_credit_limits_unacknowledged_pushes(peers, calls):
    client = peers.start_client(partition_bytes=8, scheduling_credit=1)
    x = np.ones(6, np.float32)  # three partitions of two
    fut = calls.submit(lambda: client.push_pull_async("g", x, x, 1, 0))
    peers.declare("g", tensor_id=2, servers=[0, 0, 0])
    pulls = []
    while len(pulls) < 3:
        identity, h, _ = peers.from_worker_at(0)
        if h["op"] != Op.PUSH:
            continue
        assert h["pull"] is True  # each push carries its pull
        pulls.append(h)
        assert len(pulls) == 3 or peers.nothing_at(0), "a second push went out beyond the credit"
        peers.reply_from(0, identity, Op.PUSH_ACK, key=h["key"], round=h["round"])
    for pull in pulls:
        peers.reply_from(0, identity, Op.PULL_REPLY, [np.full(2, 4.0, np.float32)], key=pull["key"],
                         round=pull["round"], dtype="float32", count=2)
    fut.result(10).result(10)
    assert x.tolist() == [4.0] * 6


def test_a_server_error_fails_the_push_pull_with_its_message(peers, calls):
    client = peers.start_client()
    x = np.ones(4, np.float32)
    fut = calls.submit(lambda: client.push_pull_async("g", x, x, 1, 0))
    peers.declare("g", tensor_id=1, servers=[0])
    identity, _, _ = peers.from_worker_at(0)
    _, push, _ = peers.from_worker_at(0)
    peers.reply_from(0, identity, Op.ERROR, key=push["key"], round=0, message="workers disagree")
    with pytest.raises(JobError, match="tensor 'g': server 0: workers disagree"):
        fut.result(10).result(10)


def test_a_malformed_pull_reply_fails_the_push_pull(peers, calls):
    client = peers.start_client()
    x = np.ones(4, np.float32)
    fut = calls.submit(lambda: client.push_pull_async("g", x, x, 1, 0))
    peers.declare("g", tensor_id=1, servers=[0])
    identity, _, _ = peers.from_worker_at(0)
    _, push, _ = peers.from_worker_at(0)
    peers.reply_from(0, identity, Op.PULL_REPLY, [np.ones(3, np.float32)], key=push["key"], round=0,
                     dtype="float32", count=3)
    with pytest.raises(JobError, match="bad pull reply .* 3 float32 elements, expected 4"):
        fut.result(10).result(10)
    assert x.tolist() == [1.0] * 4


def test_no_reply_fails_with_a_timeout_naming_the_partition(peers, calls):
    client = peers.start_client(op_timeout_s=1.0)
    x = np.ones(4, np.float32)
    fut = calls.submit(lambda: client.push_pull_async("g", x, x, 1, 0))
    peers.declare("g", tensor_id=1, servers=[0])
    with pytest.raises(OpTimeoutError, match=r"tensor 'g': partition 0 .* on server 0.*GRADPRESS_OP_TIMEOUT_S"):
        fut.result(10).result(10)


def test_a_timeout_names_the_worker_its_server_said_the_round_waits_for(peers, calls):
    # servers/waits.py's STALLED: before, only the server was named, and the job blamed this worker
    peers.start_client(op_timeout_s=1.5)
    fut, identity, push = peers.first_push(calls, np.ones(4, np.float32), np.zeros(4, np.float32))
    peers.reply_from(0, identity, Op.PUSH_ACK, key=push["key"], round=0)
    peers.reply_from(1, identity, Op.STALLED, key=push["key"], round=0, message="server 1 waits for the push of "
                     "worker 7 (at 1 s it had worker 0's)")  # not the key's server: dropped
    for waited_for in ("worker 2", "worker 1"):  # the latest is quoted: the round it waits behind completed
        peers.reply_from(0, identity, Op.STALLED, key=push["key"], round=0, message="server 0 waits for the push of "
                         f"{waited_for} (at 1 s it had worker 0's)")
    with pytest.raises(OpTimeoutError, match=r"tensor 'g': partition 0 .* round 0, on server 0: no reply within "
                                             r"GRADPRESS_OP_TIMEOUT_S=1.5 s; server 0 waits for the push of worker 1 "
                                             r"\(at 1 s it had worker 0's\)$"):
        fut.result(10).result(10)


def test_each_servers_word_on_a_round_held_up_is_logged(peers, calls, caplog):
    # one kind for every server: within half a deadline, server 0's line hid server 1's
    client = peers.start_client(partition_bytes=8, op_timeout_s=1.5)
    fut = calls.submit(lambda: client.push_pull_async("g", np.ones(4, np.float32), np.zeros(4, np.float32), 1, 0))
    peers.declare("g", tensor_id=1, servers=[0, 1])
    for server in (0, 1):
        identity, push = None, {"op": None}
        while push["op"] != Op.PUSH:
            identity, push, _ = peers.from_worker_at(server)
        peers.reply_from(server, identity, Op.STALLED, key=push["key"], round=0,
                         message=f"server {server} waits for the push of worker 1 (at 1 s it had worker 0's)")
    with caplog.at_level(logging.WARNING, logger="gradpress.worker"), pytest.raises(OpTimeoutError):
        fut.result(10).result(10)
    said = [r.getMessage() for r in caplog.records if "waits for the push of worker 1" in r.getMessage()
            and "fails at GRADPRESS_OP_TIMEOUT_S" in r.getMessage()]
    assert sorted(m.split("round 0: ")[1][:8] for m in said) == ["server 0", "server 1"], said


def test_a_compressed_push_carries_its_codec_and_a_nan_round_goes_out_nonfinite(peers, calls):
    client = peers.start_client()
    params = {"compressor": "onebit", "ef": "vanilla", "scaling": True}
    codec = CodecSpec.from_params(params)
    x = np.array([1.0, -2.0, 3.0, -4.0], np.float32)
    out = np.zeros_like(x)
    fut = calls.submit(lambda: client.push_pull_async("g", x, out, 1, 0, spec=codec))
    peers.declare("g", tensor_id=1, servers=[0])
    identity, init, _ = peers.from_worker_at(0)
    assert init["op"] == Op.INIT_KEY and init["compression_params"] == params
    _, push, frames = peers.from_worker_at(0)
    assert push["codec"] == "onebit" and len(frames) == 2 and push["pull"] is True
    first = [f.bytes for f in frames]
    peers.reply_from(0, identity, Op.PULL_REPLY, first, key=push["key"], round=0,
                     dtype="float32", count=4, codec="onebit", meta=push["meta"])
    fut.result(10).result(10)
    assert out.tolist() == [2.5, -2.5, 2.5, -2.5]  # sign times mean |x|

    # a NaN (an overflow under loss scaling): the round goes out ``nonfinite`` and without data,
    # and the push_pull waits for the server, which skips the round for every worker; it lands
    # NaN, and the key's residual (-1.5, 0.5, 0.5, -1.5 after round 0) restarts
    bad = np.array([1.0, np.nan, 0.0, 0.0], np.float32)
    skipped = client.push_pull_async("g", bad, bad, 1, 0, spec=codec)
    _, nonfinite, frames = peers.from_worker_at(0)
    assert (nonfinite["op"], nonfinite["round"], frames, nonfinite["pull"]) == (Op.PUSH, 1, [], True)
    assert "NaN" in nonfinite["nonfinite"] and "refused" not in nonfinite and not skipped.done()
    peers.reply_from(0, identity, Op.PULL_REPLY, key=push["key"], round=1, dtype="float32", count=4,
                     nonfinite="worker 0 (key 1: NaN)")
    assert np.isnan(skipped.result(10)).all() and np.isnan(bad).all()
    fut = client.push_pull_async("g", x, out, 1, 0, spec=codec)
    _, push, frames = peers.from_worker_at(0)
    assert push["round"] == 2, "the next push_pull is the next round"
    # p = x again, as at round 0 (with the old residual kept, p = x + e: other signs)
    assert [f.bytes for f in frames] == first, "the residual did not restart"


def test_a_skipped_round_of_a_push_pull_already_failed_still_restarts_its_key(peers, calls):
    """Partition 0's round fails (a server's ERROR), so the push_pull fails; partition 1's
    reply, a skipped round, comes after it. That key's residual restarts all the same, as on
    the workers whose push_pull had not failed first: every worker restarts it at that round."""
    client = peers.start_client(partition_bytes=16)  # 4 float32 a partition
    codec = CodecSpec.from_params({"compressor": "onebit", "ef": "vanilla", "scaling": True})
    x, out = np.arange(1, 9, dtype=np.float32), np.zeros(8, np.float32)

    def pushes(n=2):
        got = []
        while len(got) < n:
            identity, h, frames = peers.from_worker_at(0)
            if h["op"] == Op.PUSH:
                got.append((identity, h, frames))
        return got
    fut = calls.submit(lambda: client.push_pull_async("g", x, out, 1, 0, spec=codec))
    peers.declare("g", tensor_id=1, servers=[0, 0])
    for identity, h, frames in pushes():  # round 0: each partition's own payload back
        peers.reply_from(0, identity, Op.PULL_REPLY, [f.bytes for f in frames], key=h["key"], round=0,
                         dtype="float32", count=4, codec="onebit", meta=h["meta"])
    fut.result(10).result(10)
    t = client.tensors["g"]
    keys = [wk.key for wk in t.keys]
    assert all(t.compressor.residual(k) is not None for k in keys)
    failing = client.push_pull_async("g", x, out, 1, 0, spec=codec)
    (identity, _, _), _ = pushes()
    peers.reply_from(0, identity, Op.ERROR, message="round 1: refused by worker 1", key=keys[0], round=1)
    with pytest.raises(JobError, match="refused by worker 1"):
        failing.result(10)
    peers.reply_from(0, identity, Op.PULL_REPLY, key=keys[1], round=1, dtype="float32", count=4,
                     nonfinite="worker 1 (key: NaN)")
    deadline = time.monotonic() + 10
    while t.compressor.residual(keys[1]) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert t.compressor.residual(keys[1]) is None, "the skipped round's key kept its residual"
    assert t.compressor.residual(keys[0]) is not None  # (failed, not skipped: as it was)


def test_server_state_is_read_and_a_loaded_state_goes_just_before_the_next_push(peers, calls):
    client = peers.start_client()
    codec = CodecSpec.from_params({"compressor": "onebit", "ef": "vanilla"})
    x = np.ones(4, np.float32)
    fut = calls.submit(lambda: client.declare("g", 4, "float32", codec))
    peers.declare("g", tensor_id=5, servers=[1])
    fut.result(10)
    got = calls.submit(client.server_state, "g")
    identity, h, _ = peers.from_worker_at(1)
    assert (h["op"], h["key"]) == (Op.STATE_GET, make_key(5, 0))
    peers.reply_from(1, identity, Op.STATE, [np.full(4, 0.5, np.float32)], key=h["key"], lr=0.1)
    state = got.result(10)
    assert list(state) == [0] and state[0][0].tolist() == [0.5] * 4 and state[0][1] == 0.1

    client.load_server_state("g", {0: (np.full(4, 0.25, np.float32), 0.2)})
    client.push_pull_async("g", x, x, 1, 0, spec=codec)
    ops = [peers.from_worker_at(1)[1] for _ in range(3)]
    assert [o["op"] for o in ops] == [Op.INIT_KEY, Op.STATE, Op.PUSH]
    assert ops[1]["lr"] == 0.2


def test_barrier_returns_when_the_scheduler_says_done(peers, calls):
    client = peers.start_client()
    fut = calls.submit(client.barrier, "worker")
    _, h, _ = peers.from_worker()
    assert h["op"] == Op.BARRIER and h["group"] == "worker"
    assert not fut.done()
    peers.to_worker(Op.BARRIER_DONE, group="worker", seq=h["seq"])
    fut.result(10)


def test_finish_waits_for_the_scheduler_to_end_the_job(peers, calls):
    client = peers.start_client()
    fut = calls.submit(client.finish)
    _, h, _ = peers.from_worker()
    assert h["op"] == Op.FINISH and not fut.done()
    peers.to_worker(Op.SHUTDOWN, reason="done")
    fut.result(10)
    with pytest.raises(JobError, match="shut down"):
        client.push_pull_async("g", np.ones(1, np.float32), np.ones(1, np.float32), 1, 0)


def test_finish_says_busy_while_a_push_pull_of_its_own_waits_for_its_declaration(peers, calls):
    # the scheduler then sends the servers no word that it left: that push may still go out
    client = peers.start_client()
    x = np.ones(4, np.float32)
    client.push_pull_async("g", x, x, 1, 0)
    _, h, _ = peers.from_worker()
    assert h["op"] == Op.DECLARE
    fut = calls.submit(client.finish)
    _, h, _ = peers.from_worker()
    assert h["op"] == Op.FINISH and h.get("busy") is True, h
    peers.to_worker(Op.SHUTDOWN, reason="done")
    fut.result(10)


def test_a_barrier_the_scheduler_refuses_fails_at_once(peers, calls):
    client = peers.start_client()
    fut = calls.submit(client.barrier, "everyone")
    _, h, _ = peers.from_worker()
    peers.to_worker(Op.ERROR, message="unknown barrier group 'everyone'", group="everyone", seq=h["seq"])
    with pytest.raises(JobError, match="barrier of group 'everyone': unknown barrier group"):
        fut.result(5)


def test_compressor_state_by_partition_survives_a_load_before_the_declaration(peers, calls):
    client = peers.start_client(partition_bytes=8)
    codec = CodecSpec.from_params({"compressor": "onebit", "ef": "vanilla"})
    saved = {"residuals": {0: np.full(2, 0.5, np.float32), 1: np.full(1, -1.0, np.float32)}, "lrs": {}}
    client.load_compressor_state("g", saved)
    assert client.compressor_state("g") is saved  # kept as loaded until the tensor exists
    fut = calls.submit(lambda: client.declare("g", 3, "float32", codec))
    peers.declare("g", tensor_id=9, servers=[0, 1])
    t = fut.result(10)
    keys = [make_key(9, 0), make_key(9, 1)]
    assert sorted(t.compressor.state_dict()["residuals"]) == keys  # installed under this job's keys
    state = client.compressor_state("g")
    assert state["residuals"][0].tolist() == [0.5, 0.5] and state["residuals"][1].tolist() == [-1.0]
    with pytest.raises(ValueError, match=r"partition\(s\) \[2\].*has 2"):
        client.load_compressor_state("g", {"residuals": {2: np.zeros(1, np.float32)}, "lrs": {}})


def test_a_landed_push_pull_leaves_nothing_alive(peers, calls):
    """Its deadline (GRADPRESS_OP_TIMEOUT_S away) once held every partition, and with it the
    gradient and the output, until it fell due: a worker grew by the model's size every step."""
    import gc
    import weakref
    client = peers.start_client()
    fut = calls.submit(lambda: client.push_pull_async("g", np.ones(6, np.float32), np.zeros(6, np.float32),
                                                      divisor=1, priority=0))
    peers.declare("g", tensor_id=3, servers=[0])
    peers.serve_round(0, np.full(6, 2.0, np.float32))
    fut.result(10).result(10)
    src = np.ones(6, np.float32)
    gone = weakref.ref(src)
    fut = client.push_pull_async("g", src, np.zeros(6, np.float32), divisor=1, priority=0)
    peers.serve_round(0, np.full(6, 2.0, np.float32))
    fut.result(10)
    del src, fut
    import time
    deadline = time.monotonic() + 5  # the future is set just before the op leaves flight
    while gone() is not None and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert gone() is None, "a landed push_pull's input is still referenced"


def test_the_deadline_table_forgets_cancelled_callbacks_at_once():
    import weakref

    from gradpress.worker.deadlines import Deadlines
    from gradpress.worker.future import Future
    table = Deadlines()
    fired = []

    class Held:
        pass
    held = Held()
    gone = weakref.ref(held)
    entry = table.add(10.0, lambda h=held: fired.append(h))
    del held
    table.cancel(entry)
    assert gone() is None and len(table) == 0
    table.expire(11.0)
    assert fired == []
    # a future nobody holds any more is not kept alive (nor failed); a held one times out
    lost, kept = Future("lost"), Future("kept")
    lost_ref = weakref.ref(lost)
    table.add_future(1.0, lost, 1.0)
    table.add_future(1.0, kept, 1.0)
    del lost
    assert lost_ref() is None
    table.expire(2.0)
    with pytest.raises(OpTimeoutError, match="kept: no answer within 1 s"):
        kept.result(0)
    # many cancelled entries are dropped from the heap long before they fall due
    entries = [table.add(100.0 + i, lambda: None) for i in range(3000)]
    for e in entries[:2500]:
        table.cancel(e)
    assert len(table) == 500 and len(table._heap) < 3000


def test_release_forgets_tensors_here_and_tells_their_servers_once_landed(peers, calls):
    client = peers.start_client(partition_bytes=16)
    src, out = np.ones(8, np.float32), np.zeros(8, np.float32)
    fut = calls.submit(lambda: client.push_pull_async("g", src, out, 1, 0))
    peers.declare("g", tensor_id=4, servers=[1, 0])
    job = fut.result(10)
    _, init, _ = peers.from_worker_at(1)  # the round has started: "g" is declared here
    assert (init["op"], init["name"]) == (Op.INIT_KEY, "g"), init
    # a round in flight: nothing is released, and the caller hears why
    with pytest.raises(ValueError, match=r"cannot release tensors \['g'\]: a push_pull of them is still under way"):
        client.release(["g"], servers=True)
    assert client.tensor("g") is not None
    for server in (1, 0):
        peers.serve_round(server, np.ones(4, np.float32))
    job.result(10)
    # a compressed tensor's residuals go with it
    codec = CodecSpec.from_params({"compressor": "onebit", "ef": "vanilla"})
    client.load_compressor_state("c", {"residuals": {0: np.full(2, 0.5, np.float32)}, "lrs": {}})
    fut = calls.submit(lambda: client.declare("c", 2, "float32", codec))
    peers.declare("c", tensor_id=5, servers=[0])
    fut.result(10)
    assert client.compressor_state("c") is not None
    client.release(["g", "c", "never-declared"], servers=True)
    assert client.tensor("g") is None and client.tensor("c") is None and client.compressor_state("c") is None
    got = {server: [peers.from_worker_at(server)[1] for _ in range(count)] for server, count in ((0, 2), (1, 1))}
    assert {(server, h["op"], h["key"]) for server, hs in got.items() for h in hs} == \
        {(0, Op.RELEASE, make_key(4, 1)), (1, Op.RELEASE, make_key(4, 0)), (0, Op.RELEASE, make_key(5, 0))}
    # a worker that only forgets its own side sends nothing
    fut = calls.submit(lambda: client.declare("h", 2, "float32"))
    peers.declare("h", tensor_id=6, servers=[1])
    fut.result(10)
    client.release(["h"], servers=False)
    assert client.tensor("h") is None and peers.nothing_at(1)


def test_a_client_whose_communication_thread_stopped_waits_for_its_end_at_shutdown():
    """After a fatal error the thread may still drain its GPU work and deliver its abort:
    the process's exit waits for that (bounded), before the interpreter finalizes the pinned
    memory a queued copy may still read."""
    import threading
    from types import SimpleNamespace

    from gradpress.worker.client import WorkerClient
    from gradpress.worker.stages import DRAIN_S
    joined = []
    stopped = threading.Event()
    stopped.set()
    client = WorkerClient.__new__(WorkerClient)
    client.aborted = False
    client.comm = SimpleNamespace(stopped=stopped, join=lambda timeout: joined.append(timeout), wake=lambda: None)
    client.finish()
    assert joined and joined[0] >= DRAIN_S + 2, joined
