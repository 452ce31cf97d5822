"""The scheduler's tensor declarations, without sockets."""
from gradpress.placement import KeyPlacement
from gradpress.net.protocol import Op
from gradpress.scheduler.declarations import Declarations


def decls(workers=2, servers=2):
    return Declarations(workers, KeyPlacement(servers), timeout_s=10)


def test_answer_goes_to_all_once_every_worker_declared_alike():
    d = decls()
    assert d.declare(b"w0", 0, "a", 10, "float32", [6, 4], now=0) == []
    [(to, op, fields)] = d.declare(b"w1", 1, "a", 10, "float32", [6, 4], now=1)
    assert sorted(to) == [b"w0", b"w1"] and op == Op.DECLARED
    assert fields["servers"] == [0, 1] and fields["tensor_id"] == 1
    # a second tensor gets a new id, and its partitions go where the bytes are fewest
    d.declare(b"w1", 1, "b", 3, "float64", [3], now=2)
    [(_, _, fields)] = d.declare(b"w0", 0, "b", 3, "float64", [3], now=2)
    assert fields["tensor_id"] == 2 and fields["servers"] == [1]


def test_ids_do_not_depend_on_the_order_workers_declare_in():
    d = decls()
    d.declare(b"w0", 0, "x", 4, "float32", [4], now=0)
    d.declare(b"w1", 1, "y", 4, "float32", [4], now=0)
    [(_, _, fx)] = d.declare(b"w1", 1, "x", 4, "float32", [4], now=0)
    [(_, _, fy)] = d.declare(b"w0", 0, "y", 4, "float32", [4], now=0)
    assert (fx["tensor_id"], fy["tensor_id"]) == (1, 2)


def test_disagreement_is_an_error_naming_tensor_and_workers():
    d = decls()
    d.declare(b"w0", 0, "fc.weight", 10, "float32", [10], now=0)
    [(to, op, fields)] = d.declare(b"w1", 1, "fc.weight", 12, "float32", [12], now=0)
    assert op == Op.ERROR and sorted(to) == [b"w0", b"w1"]
    assert "'fc.weight'" in fields["message"] and "worker 0 declared 10" in fields["message"] \
        and "worker 1 declared 12" in fields["message"]


def test_a_worker_that_never_declares_is_named_at_the_deadline():
    d = decls(workers=3)
    d.declare(b"w0", 0, "t", 1, "float32", [1], now=0)
    d.declare(b"w2", 2, "t", 1, "float32", [1], now=1)
    assert d.expire(now=5) == []
    [(to, fields)] = d.expire(now=11)
    assert sorted(to) == [b"w0", b"w2"] and "not by worker(s) [1]" in fields["message"]
    assert d.expire(now=20) == []  # reported once


def test_the_log_names_whose_declarations_are_awaited_at_half_the_deadline_once(caplog):
    d = decls(workers=3)
    for name in ("a", "b"):
        d.declare(b"w0", 0, name, 1, "float32", [1], now=0)
    d.expire(now=4)
    assert caplog.text == ""
    d.expire(now=6)
    d.expire(now=7)
    assert caplog.text.count("declarations not yet made") == 1, caplog.text
    assert "tensor 'a' by worker(s) [1, 2], and 1 more" in caplog.text


def test_partitions_that_do_not_add_up_are_refused():
    [(_, op, fields)] = decls().declare(b"w0", 0, "t", 10, "float32", [3, 3], now=0)
    assert op == Op.ERROR and "do not add up" in fields["message"]


def test_more_partitions_than_a_key_holds_or_tensors_past_the_cap_are_refused(monkeypatch):
    from gradpress.placement import MAX_PARTITIONS
    from gradpress.scheduler import declarations
    d = decls()
    [(_, op, fields)] = d.declare(b"w0", 0, "t", MAX_PARTITIONS + 1, "float32", [1] * (MAX_PARTITIONS + 1), now=0)
    assert op == Op.ERROR and f"at most {MAX_PARTITIONS}" in fields["message"]
    monkeypatch.setattr(declarations, "MAX_TENSORS", 2)
    for name in ("a", "b"):
        assert d.declare(b"w0", 0, name, 1, "float32", [1], now=0) == []  # (waiting for worker 1)
    [(_, op, fields)] = d.declare(b"w0", 0, "c", 1, "float32", [1], now=0)
    assert op == Op.ERROR and "already declared 2 tensors" in fields["message"]
    assert d.declare(b"w1", 1, "a", 1, "float32", [1], now=0)[0][1] == Op.DECLARED  # a known name goes on
