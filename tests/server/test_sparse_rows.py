"""Row-sparse gradients below the network: the CPU kernels against numpy, the row hash's
balance, the server's checks of every pushed row, and the defects of Zen's published
code that gradpress must not have (row 0 as the empty marker, lost insertions, unchecked
overflow, two different hash moduli)."""
import numpy as np
import pytest
import torch

from gradpress.kernels.cpu import rows as k
from gradpress.kernels.rowhash import owners
from gradpress.net.protocol import Op
from gradpress.row_placement import RowLayout, imbalance, range_owners
from gradpress.server.sparse import init_key
from gradpress.server.store import PushError
from gradpress.trace import Tracer
from gradpress.worker.sparse import SparseResult, SparseShares, coalesce, extract, land


def zipf_ids(n: int, rows: int, seed: int = 0, a: float = 1.1) -> np.ndarray:
    return (np.random.default_rng(seed).zipf(a, n) - 1) % rows


# ---- worker kernels ---------------------------------------------------------------

def test_extract_finds_exactly_the_non_zero_rows_row_0_included():
    m = np.zeros((50, 4), np.float32)
    m[0, 3] = 1.5       # row 0 is a row like any other (Zen used index 0 as "empty")
    m[7, 0] = np.nan    # NaN is not zero: the row travels and the sum shows it
    m[49, 1] = -2.0
    m[20, 2] = -0.0     # negative zero is zero
    rows = extract(m)
    assert rows.indices.tolist() == [0, 7, 49]
    np.testing.assert_array_equal(rows.values, m[[0, 7, 49]])
    assert extract(np.zeros((0, 3), np.float32)).indices.size == 0



@pytest.mark.parametrize("width", [64, 65, 130, 512])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_extract_of_wide_rows_tests_every_block(width, dtype):
    """Rows of 64 values or more are tested a block of 64 at a time: a value in any
    block, the last partial one included, makes the row travel; -0.0 does not."""
    m = np.zeros((40, width), dtype)
    m[1, 0] = 1.0                # first value of the first block
    m[3, width - 1] = np.nan     # last value of the last block (partial where width % 64)
    m[5, 63] = -3.0              # last value of the first block
    m[8, :] = -0.0               # all negative zeros: not a row to send
    m[9, width // 2] = 1e-30     # tiny, not zero
    m[39, 64 if width > 64 else 0] = 2.0
    rows = extract(m)
    assert rows.indices.tolist() == [1, 3, 5, 9, 39]
    np.testing.assert_array_equal(rows.values, m[[1, 3, 5, 9, 39]])

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_coalesce_sums_duplicates_like_torch(dtype):
    rng = np.random.default_rng(1)
    ids = np.array([5, 0, 5, 9, 0, 5, 3])
    vals = (rng.integers(-8, 8, (ids.size, 3)) / 4).astype(dtype)
    got = coalesce(ids, vals, 10, "t")
    want = torch.sparse_coo_tensor(torch.from_numpy(ids).view(1, -1), torch.from_numpy(vals.astype(np.float64)),
                                   (10, 3), check_invariants=True).coalesce()
    assert got.indices.tolist() == want.indices()[0].tolist() and got.values.dtype == dtype
    np.testing.assert_array_equal(got.values.astype(np.float64), want.values().numpy())


def test_coalesce_refuses_an_index_out_of_range_naming_the_tensor():
    for bad in (10, -1):
        with pytest.raises(ValueError, match=f"embedding.*row index {bad} is out of range"):
            coalesce(np.array([1, bad]), np.ones((2, 2), np.float32), 10, "push_pull of 'embedding'")
    with pytest.raises(ValueError, match="3 row indices but values of shape"):
        coalesce(np.array([1, 2, 3]), np.ones((2, 2), np.float32), 10, "t")


# ---- the hash: one modulus, balance under skew ------------------------------------

@pytest.mark.parametrize("servers", [1, 2, 3, 5, 7])
def test_every_row_has_one_owner_and_every_side_computes_the_same(servers):
    """Zen's moduli disagreed when the size did not divide evenly; here rows = 100003 is
    prime, and the worker's split, the server's check and numpy agree on every row."""
    rows = 100003
    layout = RowLayout(rows, 2, seed=42, num_servers=servers)
    everything = np.arange(rows, dtype=np.int64)
    numpy_owner = owners(everything, 42, servers)
    assert numpy_owner.min() >= 0 and numpy_owner.max() < servers
    shares = SparseShares(coalesce(everything, np.ones((rows, 2), np.float32), rows, "t"), layout).shares
    assert sum(s[0].size for s in shares) == rows
    for s, (idx, _) in enumerate(shares):
        assert (numpy_owner[idx.astype(np.int64)] == s).all()
        assert k.check_rows(idx, rows, layout.stream, servers, s) == (k.ROWS_OK, -1)
        if servers > 1:  # a row of another share is refused by this one
            other = shares[(s + 1) % servers][0][:1]
            assert k.check_rows(other, rows, layout.stream, servers, s)[0] == k.ROWS_NOT_OWNED
    assert RowLayout(rows, 2, 43, servers).owners(everything[:1000]).tolist() != numpy_owner[:1000].tolist() \
        or servers == 1, "the seed must change the hash"


def test_hash_partitioning_is_balanced_under_zipf_skew_where_ranges_are_not():
    rows, servers = 1_000_000, 4
    # what servers receive: each worker's batch, coalesced (a row once per worker and step)
    ids = np.concatenate([np.unique(zipf_ids(100_000, rows, seed=w)) for w in range(4)])
    hashed = imbalance(owners(ids, 0, servers), servers)
    ranged = imbalance(range_owners(ids, rows, servers), servers)
    assert hashed <= 1.1, hashed
    assert ranged > 1.3, ranged  # Zipf's hot rows are the low ids: the first range gets most of them


# ---- server kernels ----------------------------------------------------------------

def test_merge_sum_equals_numpy_and_checks_its_capacity():
    rng = np.random.default_rng(2)
    a = np.unique(rng.integers(0, 100, 40)).astype(np.uint32)
    b = np.unique(rng.integers(0, 100, 40)).astype(np.uint32)
    av, bv = rng.standard_normal((a.size, 3)).astype(np.float32), rng.standard_normal((b.size, 3)).astype(np.float32)
    out_i, out_v = np.empty(a.size + b.size, np.uint32), np.empty((a.size + b.size, 3), np.float32)
    n = k.merge_sum(a, av, b, bv, out_i, out_v)
    dense = np.zeros((100, 3), np.float32)
    dense[a] += av
    dense[b] += bv
    union = np.union1d(a, b)
    assert out_i[:n].tolist() == union.tolist()
    np.testing.assert_array_equal(out_v[:n], dense[union])
    # Zen wrote past its buffers; every kernel here stops at its capacity
    assert k.merge_sum(a, av, b, bv, out_i[:n - 1], out_v[:n - 1]) == -1
    assert k.union(a, b, np.empty(n - 1, np.uint32)) == -1
    assert k.to_bitmap(a, b, np.empty((a.size + 7) // 8, np.uint8), np.empty(0, np.uint32)) in (-1, 0)
    assert k.from_bitmap(a, np.full((a.size + 7) // 8, 255, np.uint8), b, np.empty(1, np.uint32)) == -1


def test_bitmap_over_known_rows_round_trips_with_row_0():
    known = np.array([0, 3, 4, 10, 99], np.uint32)
    for idx in ([0, 4], [0, 1, 99, 100], [], [5, 6]):
        idx = np.array(idx, np.uint32)
        bitmap, fresh = np.empty(1, np.uint8), np.empty(idx.size, np.uint32)
        nf = k.to_bitmap(known, idx, bitmap, fresh)
        out = np.empty(idx.size, np.uint32)
        assert k.from_bitmap(known, bitmap, fresh[:nf], out) == idx.size
        assert out.tolist() == idx.tolist()


# ---- the server's key: checks, sums, replies ----------------------------------------

ROWS, WIDTH, SERVERS = 1001, 3, 2


def make_state(shard=0, workers=2, dtype="float32"):
    layout = RowLayout(ROWS, WIDTH, 7, SERVERS)
    keys = {}
    init_key(keys, {"key": (5 << 16) | shard, "name": "emb", "count": 1, "dtype": dtype,
                    "sparse": layout.wire()}, workers, False, Tracer(""))
    return keys[(5 << 16) | shard], layout


def share_of(layout, ids, vals, shard=0):
    return SparseShares(coalesce(ids, vals, ROWS, "t"), layout).shares[shard]


def push_frames(idx, vals):
    return [memoryview(np.ascontiguousarray(idx)).cast("B"), memoryview(np.ascontiguousarray(vals)).cast("B")]


def header(n, rnd=0, dtype="float32"):
    return {"op": Op.PUSH, "key": 5 << 16, "round": rnd, "dtype": dtype, "count": n, "sparse": True,
            "from": "worker 0"}


def good_push(layout, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, ROWS, 60)
    ids[:2] = [0, ROWS - 1]
    return share_of(layout, ids, (rng.integers(-9, 9, (60, WIDTH)) / 4).astype(np.float32))


def bad_pushes(layout):
    idx, vals = good_push(layout, 3)
    owned = np.array([i for i in range(ROWS) if layout.owners(np.array([i]))[0] == 0])
    yield "out of range", np.array([idx[0], ROWS + 7], idx.dtype), vals[:2], None
    yield "strictly increasing", idx[::-1].copy(), vals[::-1].copy(), None
    yield "strictly increasing", np.array([owned[1], owned[1]], idx.dtype), vals[:2], None  # a duplicate
    not_owned = np.array([i for i in range(ROWS) if layout.owners(np.array([i]))[0] == 1][:1], idx.dtype)
    yield "belongs to another server", not_owned, vals[:1], None
    yield r"values per row", idx, np.ones((idx.size, WIDTH + 1), np.float32), None  # wrong row width
    yield "values are float64", idx, vals.astype(np.float64), "float64"
    yield "rows, but the table has", np.arange(ROWS + 1, dtype=idx.dtype), np.ones((ROWS + 1, WIDTH), np.float32), None


def test_bad_pushes_are_refused_naming_the_tensor_and_the_sum_stays_intact():
    state, layout = make_state()
    a, b = good_push(layout, 1), good_push(layout, 2)
    state.push(b"w0", 0, state.decode(header(a[0].size), push_frames(*a)))
    for what, idx, vals, dtype in bad_pushes(layout):
        with pytest.raises(PushError, match=f"sparse tensor 'emb'.*{what}"):
            h = header(idx.size, dtype=dtype or "float32")
            state.push(b"w1", 0, state.decode(h, push_frames(idx, vals)))
    with pytest.raises(PushError, match="1 data frames, expected 2"):
        state.decode(header(a[0].size), push_frames(*a)[:1])
    with pytest.raises(PushError, match="second push of round 0"):
        state.push(b"w0", 0, state.decode(header(a[0].size), push_frames(*a)))
    replies = state.push(b"w1", 0, state.decode(header(b[0].size), push_frames(*b)))
    replies += state.pull(b"w0", 0)
    assert [r.op for r in replies] == [Op.PULL_REPLY]
    reply = replies[0]
    dense = np.zeros((ROWS, WIDTH))
    np.add.at(dense, a[0].astype(np.int64), a[1])
    np.add.at(dense, b[0].astype(np.int64), b[1])
    union = np.union1d(a[0], b[0])
    assert reply.fields["sparse"] == "rows" and reply.fields["count"] == union.size
    assert reply.buffers[0].tolist() == union.tolist()
    np.testing.assert_array_equal(reply.buffers[1], dense[union])


def test_init_key_checks_the_layout_and_its_agreement():
    layout = RowLayout(ROWS, WIDTH, 7, SERVERS)
    good = {"key": 5 << 16, "name": "emb", "count": 1, "dtype": "float32", "sparse": layout.wire()}
    keys = {}
    init_key(keys, dict(good), 2, False, Tracer(""))
    for field, value, what in [("sparse", dict(layout.wire(), seed=8), "layout"), ("count", 3, "3 float32 elements")]:
        with pytest.raises(PushError, match=f"sparse tensor 'emb'.*{what}"):
            init_key(keys, dict(good, **{field: value}), 2, False, Tracer(""))
    for bad, what in [(dict(layout.wire(), width=0), "width=0"), ({"rows": 5}, "exactly rows, width"),
                      (dict(layout.wire(), rows=True), "rows=True")]:
        with pytest.raises(PushError, match=what):
            init_key({}, dict(good, sparse=bad), 2, False, Tracer(""))
    with pytest.raises(PushError, match="BYTEPS_ENABLE_ASYNC"):
        init_key({}, dict(good), 2, True, Tracer(""))


def run_rounds(layout, pushes_per_round, workers):
    """Push every round into both shares' states; land the replies as a worker does."""
    from gradpress.worker.jobs import PartitionOp, PushPull
    from gradpress.worker.keys import Tensor, WorkerKey
    states = [make_state(s, workers)[0] for s in range(SERVERS)]
    tensor = Tensor("emb", SERVERS, "float32", 5, layout.declared_parts(), list(range(SERVERS)), None, layout)
    tensor.keys = [WorkerKey((5 << 16) | s, tensor, s, s, tensor.parts[s], 0) for s in range(SERVERS)]
    results, encodings = [], []
    for rnd, pushes in enumerate(pushes_per_round):
        out = SparseResult(layout, "float32", 1)
        job = PushPull(tensor, None, out, 1, None, SERVERS)
        for s, state in enumerate(states):
            for w, (ids, vals) in enumerate(pushes):
                idx, v = share_of(layout, ids, vals, s)
                state.push(b"w%d" % w, rnd, state.decode(header(idx.size, rnd), push_frames(idx, v)))
            reply = state.pull(b"w0", rnd)[0]
            encodings.append(reply.fields["sparse"])
            frames = [memoryview(np.ascontiguousarray(b)).cast("B") for b in reply.buffers]
            land(PartitionOp(job, tensor.keys[s], rnd), dict(reply.fields), frames)
        results.append(out.rows())
    return results, encodings


def test_replies_become_bitmaps_over_known_rows_where_smaller_and_decode_exactly():
    layout = RowLayout(ROWS, WIDTH, 7, SERVERS)
    rng = np.random.default_rng(5)
    rounds = [[(zipf_ids(400, ROWS, seed=10 * r + w), (rng.integers(-9, 9, (400, WIDTH)) / 4).astype(np.float32))
               for w in range(2)] for r in range(4)]
    results, encodings = run_rounds(layout, rounds, workers=2)
    assert "bitmap" in encodings[2:], encodings  # hot rows repeat: after round 0 a bitmap is smaller
    for got, pushes in zip(results, rounds):
        dense = np.zeros((ROWS, WIDTH))
        for ids, vals in pushes:
            np.add.at(dense, ids, vals)
        union = np.unique(np.concatenate([ids for ids, _ in pushes]))
        assert got.indices.tolist() == union.tolist()
        np.testing.assert_array_equal(got.values, dense[union])


def test_a_bitmap_over_other_known_rows_is_refused():
    layout = RowLayout(ROWS, WIDTH, 7, SERVERS)
    from gradpress.worker.jobs import PartitionOp, PushPull
    from gradpress.worker.keys import Tensor, WorkerKey
    tensor = Tensor("emb", SERVERS, "float32", 5, layout.declared_parts(), [0, 1], None, layout)
    wk = WorkerKey(5 << 16, tensor, 0, 0, tensor.parts[0], 0)
    job = PushPull(tensor, None, SparseResult(layout, "float32", 1), 1, None, 2)
    h = {"key": 5 << 16, "round": 0, "dtype": "float32", "count": 1, "sparse": "bitmap", "known": 3}
    with pytest.raises(ValueError, match="bitmap over 3 known rows; this worker knows 0"):
        land(PartitionOp(job, wk, 0), h, [b"\x01", b"", b"\x00" * 12])


def test_the_engine_answers_a_bad_sparse_push_with_an_error_and_still_sums(tmp_path):
    """Through a real engine thread and the protocol's encoder: a peer's unsorted push gets an
    ERROR naming the tensor, and the round completes with the good pushes only."""
    import zmq
    from gradpress.net import protocol, transport
    from gradpress.server.engine import STOP, Engine
    ctx = zmq.Context()
    replies, reports = ctx.socket(zmq.PULL), ctx.socket(zmq.PULL)
    replies.bind("inproc://sparse-replies")
    reports.bind("inproc://sparse-reports")
    engine = Engine(0, ctx, "inproc://sparse-replies", "inproc://sparse-reports", "server 0", num_workers=2,
                    async_mode=False, tracer=Tracer(""))
    engine.start()
    try:
        layout = RowLayout(ROWS, WIDTH, 7, SERVERS)

        def send(who, op, frames=(), **fields):
            h = protocol.decode(protocol.encode(op, "worker 0", key=5 << 16, **fields))
            engine.inbox.put((who, h, [bytes(memoryview(np.ascontiguousarray(f)).cast("B")) for f in frames]))

        send(b"w0", Op.INIT_KEY, name="emb", count=1, dtype="float32", sparse=layout.wire())
        send(b"w1", Op.INIT_KEY, name="emb", count=1, dtype="float32", sparse=layout.wire())
        a, b = good_push(layout, 1), good_push(layout, 2)
        send(b"w0", Op.PUSH, [a[0][::-1].copy(), a[1]], round=0, dtype="float32", count=a[0].size, sparse=True)
        send(b"w0", Op.PUSH, list(a), round=0, dtype="float32", count=a[0].size, sparse=True)
        send(b"w1", Op.PUSH, list(b), round=0, dtype="float32", count=b[0].size, sparse=True)
        send(b"w0", Op.PULL, round=0)
        got = []
        while len(got) < 4:
            assert replies.poll(5000), f"the engine sent {len(got)} replies, expected 4"
            got.append(transport.recv(replies, routed=True))
        error = got[0][1]
        assert error["op"] == Op.ERROR and "sparse tensor 'emb'" in error["message"] \
            and "strictly increasing" in error["message"], error
        reply, frames = got[3][1], got[3][2]
        assert reply["op"] == Op.PULL_REPLY and reply["sparse"] == "rows"
        union = np.union1d(a[0], b[0])
        dense = np.zeros((ROWS, WIDTH), np.float32)
        dense[a[0].astype(np.int64)] += a[1]
        dense[b[0].astype(np.int64)] += b[1]
        assert np.frombuffer(frames[0].buffer, layout.index_dtype).tolist() == union.tolist()
        np.testing.assert_array_equal(np.frombuffer(frames[1].buffer, np.float32).reshape(-1, WIDTH), dense[union])
    finally:
        engine.inbox.put(STOP)
        engine.join(timeout=5)
        replies.close(linger=0)
        reports.close(linger=0)
        ctx.destroy(linger=0)  # a socket left with unsent messages must not block the teardown


def test_checkpoints_find_no_server_state_on_a_sparse_key():
    """A row sum is exact: a sparse share keeps no residual (STATE_GET answers none) and
    refuses one to restore, naming the tensor; known rows restart empty on both sides with
    a new job (a resumed worker's tensors are declared afresh)."""
    state, _ = make_state()
    assert state.server_state() == (None, None)
    with pytest.raises(PushError, match="sparse tensor 'emb'.*no server error feedback"):
        state.load_server_state(np.zeros(3, np.float32), None)
