"""Engine threads: how many, replies go out through the transport, and a failing engine stops its server."""
import logging
import threading

import numpy as np
import pytest
import zmq

from cluster import TEST_SECRET
from gradpress.config import Settings
from gradpress.net import protocol, transport
from gradpress.net.protocol import Op
from gradpress.scheduler.scheduler import Scheduler
from gradpress.net.node import AddressBook, NodeInfo, SchedulerLink
from gradpress.server.engine import DEFAULT_ENGINE_THREADS, STOP, Engine, engine_count
from gradpress.server.server import Server
from gradpress.trace import Tracer

FAULT = "injected engine fault"


def _header(op, **fields):
    """A header as the I/O thread hands it over: decoded and checked."""
    return protocol.decode(protocol.encode(op, "worker 0", **fields))


def _one_round(engine) -> np.ndarray:
    """Queue key 9's INIT_KEY, a push of 4 floats and its pull, from worker b"w0"; the values."""
    values = np.arange(4, dtype=np.float32)
    engine.inbox.put((b"w0", _header(Op.INIT_KEY, key=9, name="t", count=4, dtype="float32"), []))
    engine.inbox.put((b"w0", _header(Op.PUSH, key=9, round=0, dtype="float32", count=4), [values.tobytes()]))
    engine.inbox.put((b"w0", _header(Op.PULL, key=9, round=0), []))
    return values


def _raise(*_):
    raise RuntimeError(FAULT)


@pytest.fixture
def wired():
    """Makes an engine of a job of ``workers`` workers wired to a reply and a report
    socket, as the server wires it; (engine, replies, reports). Stopped at the end."""
    ctx, made = zmq.Context(), []

    def make(workers: int = 1):
        replies, reports = ctx.socket(zmq.PULL), ctx.socket(zmq.PULL)
        replies.bind(f"inproc://test-replies-{len(made)}")
        reports.bind(f"inproc://test-reports-{len(made)}")
        engine = Engine(0, ctx, f"inproc://test-replies-{len(made)}", f"inproc://test-reports-{len(made)}",
                        "server 0", num_workers=workers, async_mode=False, tracer=Tracer(""))
        made.append((engine, replies, reports))
        return made[-1]
    yield make
    for engine, replies, reports in made:
        if engine.is_alive():
            engine.inbox.put(STOP)
            engine.join(timeout=5)
        replies.close(linger=0)
        reports.close(linger=0)
    ctx.term()


@pytest.fixture
def inproc(wired):
    """An engine of a one-worker job wired as the server wires it."""
    return wired()


def test_replies_are_protocol_messages_addressed_to_the_worker(inproc):
    engine, replies, _ = inproc
    engine.start()
    values = _one_round(engine)
    got = []
    for _ in range(2):
        assert replies.poll(5000), f"the engine sent {len(got)} replies, expected 2"
        got.append(transport.recv(replies, routed=True))
    (to_ack, ack, _), (to_pull, reply, frames) = got
    assert (to_ack, ack["op"], ack["key"], ack["round"]) == (b"w0", Op.PUSH_ACK, 9, 0)
    assert (to_pull, reply["op"], reply["from"]) == (b"w0", Op.PULL_REPLY, "server 0")
    assert np.array_equal(np.frombuffer(frames[0].buffer, np.float32), values)


def test_a_failing_engine_reports_an_error_naming_the_failure(inproc, monkeypatch):
    engine, replies, reports = inproc
    monkeypatch.setattr(Engine, "_handle", _raise)
    engine.start()
    engine.inbox.put((b"w0", _header(Op.PULL, key=9, round=0), []))
    assert reports.poll(5000), "a failed engine said nothing"
    identity, header, frames = transport.recv(reports, routed=False)
    assert header["op"] == Op.ERROR and frames == []
    assert header["message"] == f"engine thread 0 failed: RuntimeError: {FAULT}"
    engine.join(timeout=5)
    assert not engine.is_alive() and isinstance(engine.failure, RuntimeError)
    assert not replies.poll(0), "the failure must not be sent towards a worker"


def test_engine_threads_are_the_setting_or_none_where_the_server_lacks_cores_of_its_own():
    assert [engine_count(n, cores=1, sharing=4) for n in (0, 1, 3)] == [0, 1, 3]  # a setting is kept
    assert engine_count(-1, cores=16, sharing=1) == DEFAULT_ENGINE_THREADS
    assert engine_count(-1, cores=4, sharing=2) == DEFAULT_ENGINE_THREADS  # 2 cores to itself
    assert engine_count(-1, cores=2, sharing=4) == 0  # this machine's benchmarks: 2 workers, 2 servers
    assert engine_count(-1, cores=1.5, sharing=0) == 0  # nobody known on the host: itself


def test_the_address_book_says_who_shares_a_machine():
    nodes = (NodeInfo("scheduler", -1, "h", 9000, "m1"), NodeInfo("worker", 0, "h", 0, "m1"),
             NodeInfo("server", 0, "h", 1, "m1"), NodeInfo("worker", 1, "g", 0, "m2"),
             NodeInfo("server", 1, "g", 1, ""))
    book = AddressBook(0, nodes, 2, 2)
    assert [n.name for n in book.sharing("m1")] == ["worker 0", "server 0"]  # not the scheduler
    assert book.sharing("") == [], "an unknown machine shares with nobody"


@pytest.mark.parametrize("threads,count,who", [(1, 100000, "engine thread 0"), (1, 4, "the I/O thread's engine"),
                                               (0, 100000, "the I/O thread's engine")])
def test_the_server_stops_with_an_error_naming_the_engine_failure(monkeypatch, caplog, threads, count, who):
    monkeypatch.setattr(Engine, "_handle", _raise)
    common = dict(num_worker=1, num_server=1, root_uri="127.0.0.1", node_host="127.0.0.1",
                  heartbeat_interval_s=0.1, heartbeat_timeout_s=30, connect_timeout_s=30, job_secret=TEST_SECRET)
    scheduler = Scheduler(Settings(role="scheduler", root_port=0, **common))
    threading.Thread(target=scheduler.run, daemon=True).start()
    at = dict(common, root_port=scheduler.port)
    server = Server(Settings(role="server", server_engine_threads=threads, **at))
    exit_code = []
    serving = threading.Thread(target=lambda: exit_code.append(server.run()), daemon=True)
    serving.start()
    worker = SchedulerLink(Settings(role="worker", **at), "worker", transport.context())
    dealer = None
    try:
        book = worker.register()
        dealer = transport.dealer(transport.context(), worker.settings, "127.0.0.1", book.servers[0].port, b"w0")
        with caplog.at_level(logging.ERROR, logger="gradpress.server.server"):
            transport.send(dealer, Op.INIT_KEY, "worker 0", key=1, name="t", count=count, dtype="float32")
            serving.join(timeout=15)
        assert not serving.is_alive(), "the server kept running after its engine failed"
        assert exit_code == [1]
        assert f"server 0: {who} failed: RuntimeError: {FAULT}" in caplog.text, caplog.text
        # the workers hear it from the scheduler at once, naming the server and why, not at its silence
        lost = None
        while lost is None and worker.sock.poll(5000):
            _, header, _ = transport.recv(worker.sock, routed=False)
            lost = header if header is not None and header["op"] == Op.NODE_LOST else None
        assert lost is not None, "no NODE_LOST reached the worker"
        assert (lost["role"], lost["rank"]) == ("server", 0) and FAULT in lost["reason"], lost
    finally:
        scheduler.exit_code = 0
        worker.close()
        if dealer is not None:
            dealer.close(linger=0)


def test_a_released_key_is_forgotten_after_the_work_queued_before_it(inproc):
    engine, replies, _ = inproc
    engine.start()
    _one_round(engine)
    engine.inbox.put((b"w0", _header(Op.RELEASE, key=9), []))
    engine.inbox.put((b"w0", _header(Op.RELEASE, key=9), []))  # twice: no error
    engine.inbox.put((b"w0", _header(Op.PULL, key=9, round=1), []))
    got = []
    for _ in range(3):
        assert replies.poll(5000), f"the engine sent {len(got)} replies, expected 3"
        got.append(transport.recv(replies, routed=True)[1])
    assert [h["op"] for h in got] == [Op.PUSH_ACK, Op.PULL_REPLY, Op.ERROR]
    assert got[2]["key"] == 9 and "not held here" in got[2]["message"] and "released" in got[2]["message"]
    assert 9 not in engine.keys and not replies.poll(200)


def test_a_refused_push_is_taken_without_data_and_one_with_data_is_dropped(inproc):
    """A worker whose codec refused its round pushes ``refused`` and no frame: taken (acked),
    the round fails for every puller with its reason; a refused push carrying data is an error."""
    engine, _, _ = inproc
    engine.start()  # idle: this test serves on its own thread, as the I/O thread serves its keys
    engine.serve(b"w0", _header(Op.INIT_KEY, key=9, name="t", count=4, dtype="float32",
                                compression_params={"compressor": "onebit", "ef": "vanilla"}), [])
    bad = engine.serve(b"w0", _header(Op.PUSH, key=9, round=0, dtype="float32", count=4, refused="nan"), [b"xx"])
    assert [r.op for r in bad] == [Op.ERROR] and "must carry no data" in bad[0].fields["message"]
    ack, = engine.serve(b"w0", _header(Op.PUSH, key=9, round=0, dtype="float32", count=4,
                                       refused="key 9: error feedback met NaN/inf"), [])
    assert (ack.op, ack.fields["round"]) == (Op.PUSH_ACK, 0)
    pulled, = engine.serve(b"w0", _header(Op.PULL, key=9, round=0), [])
    assert pulled.op == Op.ERROR and pulled.fields["round"] == 0
    assert "refused by worker 0 (key 9: error feedback met NaN/inf)" in pulled.fields["message"]
    # a reason is quoted whole up to logs.REASON_CHARS (the cause of a failure on another
    # machine), a longer one cut
    for why, kept in (("its encoder failed on the GPU: RuntimeError: CUDA out of memory. " + "x" * 150, 216),
                      ("y" * 100_000, 240)):
        engine.serve(b"w0", _header(Op.PUSH, key=9, round=1 + kept // 240, dtype="float32", count=4, refused=why), [])
        pulled, = engine.serve(b"w0", _header(Op.PULL, key=9, round=1 + kept // 240), [])
        assert why[:kept] in pulled.fields["message"] and len(pulled.fields["message"]) < 400, pulled.fields


def test_a_nonfinite_push_is_taken_without_data_for_a_compressed_key_only(inproc):
    """A worker whose input held NaN/inf pushes ``nonfinite`` and no frame: taken (acked), and
    the round is skipped for every puller (a PULL_REPLY naming it, without data). One that
    carries data, also says ``refused``, or is for an uncompressed key (which sums NaN/inf
    itself) is an error, and the round goes on without it."""
    engine, _, _ = inproc
    engine.start()
    engine.serve(b"w0", _header(Op.INIT_KEY, key=9, name="t", count=4, dtype="float32",
                                compression_params={"compressor": "onebit", "ef": "vanilla"}), [])
    engine.serve(b"w0", _header(Op.INIT_KEY, key=10, name="u", count=4, dtype="float32"), [])
    push = dict(round=0, dtype="float32", count=4, nonfinite="key 9: error feedback met NaN/inf")
    for key, extra, frames in ((9, {}, [b"xx"]), (9, {"refused": "no"}, []), (10, {}, [])):
        bad = engine.serve(b"w0", _header(Op.PUSH, key=key, **push, **extra), frames)
        assert [r.op for r in bad] == [Op.ERROR] and "nonfinite push must carry no data" in bad[0].fields["message"]
    ack, = engine.serve(b"w0", _header(Op.PUSH, key=9, **push), [])
    assert (ack.op, ack.fields["round"]) == (Op.PUSH_ACK, 0)
    pulled, = engine.serve(b"w0", _header(Op.PULL, key=9, round=0), [])
    assert (pulled.op, pulled.buffers) == (Op.PULL_REPLY, [])
    assert pulled.fields["nonfinite"] == "worker 0 (key 9: error feedback met NaN/inf)"
    protocol.decode(protocol.encode(Op.PULL_REPLY, "server 0", **pulled.fields))  # a reply the schema takes


def test_a_push_carrying_its_pull_is_answered_as_a_push_then_a_pull(wired):
    """``pull: true``: the ack, then the round's reply when the round completes (at once for
    the push that completes it, after the others' for the ones before); a refused push
    carries its round's failure the same way; a pull that is not a bool is refused.
    Served on the test's thread, as the I/O thread serves its keys."""
    engine, _, _ = wired(workers=2)
    engine.serve(b"w0", _header(Op.INIT_KEY, key=9, name="t", count=2, dtype="float32"), [])
    engine.serve(b"w1", _header(Op.INIT_KEY, key=9, name="t", count=2, dtype="float32"), [])
    push = dict(key=9, dtype="float32", count=2, pull=True)
    first = engine.serve(b"w0", _header(Op.PUSH, round=0, **push), [np.float32([1, 2]).tobytes()])
    assert [r.op for r in first] == [Op.PUSH_ACK], "the round is not complete: the pull waits"
    second = engine.serve(b"w1", _header(Op.PUSH, round=0, **push), [np.float32([10, 20]).tobytes()])
    assert [(r.op, r.to) for r in second] == [(Op.PUSH_ACK, b"w1"), (Op.PULL_REPLY, b"w0"),
                                              (Op.PULL_REPLY, b"w1")]
    for reply in second[1:]:
        assert np.frombuffer(reply.buffers[0], np.float32).tolist() == [11, 22]
    refused = engine.serve(b"w0", _header(Op.PUSH, round=1, refused="NaN", **push), [])
    assert [r.op for r in refused] == [Op.PUSH_ACK]
    failed = engine.serve(b"w1", _header(Op.PUSH, round=1, **push), [np.float32([1, 1]).tobytes()])
    assert [(r.op, r.to) for r in failed if r.op == Op.ERROR] == [(Op.ERROR, b"w0"), (Op.ERROR, b"w1")]
    with pytest.raises(ValueError, match="pull"):
        protocol.decode(protocol.encode(Op.PUSH, "worker 0", key=9, round=2, dtype="float32", count=2, pull=1))


def test_a_push_that_cannot_have_its_pull_is_refused_before_it_is_kept(wired):
    """A push of the next round asking for that round's pull (which the key cannot take yet) is
    refused whole: its values are not summed into that round, which the worker then pushes
    again as it should."""
    engine, _, _ = wired(workers=2)
    for w in (b"w0", b"w1"):
        engine.serve(w, _header(Op.INIT_KEY, key=9, name="t", count=2, dtype="float32"), [])
    push = dict(key=9, dtype="float32", count=2)
    engine.serve(b"w0", _header(Op.PUSH, round=0, **push), [np.float32([1, 1]).tobytes()])
    early = engine.serve(b"w0", _header(Op.PUSH, round=1, pull=True, **push), [np.float32([100, 100]).tobytes()])
    assert [r.op for r in early] == [Op.ERROR] and "asks for that round's pull" in early[0].fields["message"]
    engine.serve(b"w1", _header(Op.PUSH, round=0, **push), [np.float32([2, 2]).tobytes()])
    again = engine.serve(b"w0", _header(Op.PUSH, round=1, pull=True, **push), [np.float32([3, 3]).tobytes()])
    assert [r.op for r in again] == [Op.PUSH_ACK], again
    done = engine.serve(b"w1", _header(Op.PUSH, round=1, pull=True, **push), [np.float32([4, 4]).tobytes()])
    assert [np.frombuffer(r.buffers[0], np.float32).tolist() for r in done if r.op == Op.PULL_REPLY] == [[7, 7]] * 2


def test_a_pull_repeated_is_answered_once(wired):
    engine, _, _ = wired(workers=2)
    for w in (b"w0", b"w1"):
        engine.serve(w, _header(Op.INIT_KEY, key=9, name="t", count=2, dtype="float32"), [])
    engine.serve(b"w0", _header(Op.PUSH, key=9, round=0, dtype="float32", count=2), [np.float32([1, 1]).tobytes()])
    for _ in range(3):
        assert engine.serve(b"w0", _header(Op.PULL, key=9, round=0), []) == []
    done = engine.serve(b"w1", _header(Op.PUSH, key=9, round=0, dtype="float32", count=2, pull=True),
                        [np.float32([2, 2]).tobytes()])
    assert sorted(r.to for r in done if r.op == Op.PULL_REPLY) == [b"w0", b"w1"]


def test_every_push_s_learning_rate_is_checked_and_shared_memory_is_refused_for_a_compressed_key(inproc):
    """A refused push's learning rate too (it is kept); a compressed key's INIT_KEY naming a
    shared segment is refused before anything is mapped or allocated for it."""
    engine, _, _ = inproc
    engine.start()
    params = {"compressor": "onebit", "ef": "vanilla"}
    engine.serve(b"w0", _header(Op.INIT_KEY, key=9, name="t", count=4, dtype="float32", compression_params=params), [])
    bad = engine.serve(b"w0", _header(Op.PUSH, key=9, round=0, dtype="float32", count=4, refused="no",
                                      lr=float("nan")), [])
    assert [r.op for r in bad] == [Op.ERROR] and "learning rate nan" in bad[0].fields["message"], bad
    shared = engine.serve(b"w0", _header(Op.INIT_KEY, key=9, name="t", count=4, dtype="float32",
                                         compression_params=params, shm=[1, 2, 3, 0]), [])
    assert [r.op for r in shared] == [Op.ERROR], shared
    assert "compressed keys travel in frames" in shared[0].fields["message"] and not engine.push_views
