"""The server's round rules, without sockets."""
import numpy as np
import pytest

from gradpress.net.protocol import Op
from gradpress.server.store import KeyState, PushError

A, B, C = b"A", b"B", b"C"


def key(workers=3, dtype="float32", count=5, async_mode=False):
    return KeyState(key=1 << 16, name="w", count=count, dtype=dtype, num_workers=workers, async_mode=async_mode)


def arr(v, n=5, dtype=np.float32):
    return np.full(n, v, dtype)


def test_round_completes_when_all_pushed_and_answers_early_and_late_pulls():
    k = key()
    assert k.push(A, 0, arr(1)) == [] and k.pull(A, 0) == []  # early pull waits
    assert k.push(B, 0, arr(2)) == []
    replies = k.push(C, 0, arr(4))
    assert [r.to for r in replies] == [A] and replies[0].op == Op.PULL_REPLY
    assert np.all(replies[0].buffers[0] == 7) and replies[0].fields["round"] == 0
    late = k.pull(B, 0)
    assert late[0].buffers[0] is replies[0].buffers[0]  # every puller gets the same bytes


def test_next_round_push_before_completion_never_mixes():
    k = key(workers=2)
    k.push(A, 0, arr(1))
    k.push(A, 1, arr(100))  # A races ahead to round 1
    r0 = k.push(B, 0, arr(2))
    assert r0 == [] and np.all(k.pull(A, 0)[0].buffers[0] == 3)
    r1 = k.pull(B, 1)
    assert r1 == []
    out = k.push(B, 1, arr(200))
    assert np.all(out[0].buffers[0] == 300) and out[0].fields["round"] == 1


def test_a_reply_in_flight_is_never_overwritten_by_the_next_round():
    k = key(workers=1)
    first = k.push(A, 0, arr(1)) or k.pull(A, 0)
    held = first[0].buffers[0]
    k.push(A, 1, arr(50))
    assert np.all(held == 1)


def _finish_round0(k):
    """Complete round 0 from whatever state a rejected message left; returns its sum."""
    out = []
    for sender, v in ((A, 1), (B, 2)):
        if sender not in k.pushed:
            out += k.push(sender, 0, arr(v))
    out += k.pull(C, 0)
    return out[-1].buffers[0]


@pytest.mark.parametrize("action,match", [
    (lambda k: (k.push(A, 0, arr(1)), k.push(A, 0, arr(1))), "second push of round 0"),
    (lambda k: k.push(A, 5, arr(1)), "push for round 5"),
    (lambda k: k.pull(A, 3), "pull for round 3"),
    (lambda k: (k.push(A, 1, arr(1)), k.push(A, 1, arr(1))), "third round in flight"),
])
def test_protocol_violations_are_errors_and_do_not_corrupt_the_sum(action, match):
    k = key(workers=2)
    with pytest.raises(PushError, match=match):
        action(k)
    assert np.all(_finish_round0(k) == 3), "a rejected message changed the sum"


def test_decode_checks_size_dtype_and_frames():
    k = key(count=4)
    good = np.arange(4, dtype=np.float32)
    assert np.array_equal(k.decode({"dtype": "float32", "count": 4}, [good.tobytes()]), good)
    for header, frames, why in [
        ({"dtype": "float32", "count": 5}, [good.tobytes()], "push of 5"),
        ({"dtype": "float64", "count": 4}, [good.tobytes()], "float64"),
        ({"dtype": "float32", "count": 4}, [good.tobytes()[:-1]], "15 bytes"),
        ({"dtype": "float32", "count": 4}, [], "0 data frames"),
    ]:
        with pytest.raises(PushError, match=why):
            k.decode(header, frames)


def test_init_key_disagreement_names_the_tensor():
    with pytest.raises(PushError, match="'w'"):
        key(count=5).check_init("w", 6, "float32", None)


def test_fp16_sums_in_fp32_and_rounds_once():
    # 1024 plus 63 quarters: in float16 each quarter is lost next to 1024 (spacing 1.0)
    n = 64
    k = key(workers=n, dtype="float16", count=1)
    out = k.push(bytes([0]), 0, np.array([1024], np.float16))
    for i in range(1, n):
        out += k.push(bytes([i]), 0, np.array([0.25], np.float16))
    got = (out + k.pull(A, 0))[-1].buffers[0]
    assert got.dtype == np.float16 and got[0] == np.float16(1024 + 63 * 0.25) == 1040
    naive = np.float16(1024)
    for _ in range(n - 1):
        naive = np.float16(naive + np.float16(0.25))
    assert naive == 1024, "the example no longer shows fp16 accumulation losing terms"


def test_float64_keeps_its_precision():
    k = key(workers=2, dtype="float64", count=1)
    k.push(A, 0, np.array([1.0], np.float64))
    r = k.push(B, 0, np.array([1e-12], np.float64)) + k.pull(A, 0)
    assert r[0].buffers[0][0] == 1.0 + 1e-12


def test_async_mode_round_0_initialises_the_store_then_pushes_add_at_once_and_pulls_read_it():
    k = key(workers=2, async_mode=True)
    assert k.push(A, 0, arr(10)) == []           # rank 0's initial parameters
    assert k.pull(A, 0) == []                    # round 0 waits for every worker
    k.push(B, 1, arr(100))                       # B races ahead: held until round 0 completes
    replies = k.push(B, 0, arr(0))               # the others push zeros
    assert [r.to for r in replies] == [A] and np.all(replies[0].buffers[0] == 10), \
        "round 0 answers with the initial parameters, before any delta"
    assert np.all(k.pull(B, 1)[0].buffers[0] == 110), "B's early delta was added after the initialisation"
    k.push(A, 1, arr(-1))
    snapshot = k.pull(A, 1)[0].buffers[0]
    assert np.all(snapshot == 109) and k.pull(A, 1)[0].fields["round"] == 1
    k.push(A, 7, arr(-2))                        # any round: a delta is a delta
    assert np.all(k.pull(B, 3)[0].buffers[0] == 107)
    assert np.all(snapshot == 109), "a pulled snapshot must not change under later pushes"


def test_async_mode_refuses_compressed_keys():
    with pytest.raises(PushError, match="BYTEPS_ENABLE_ASYNC"):
        KeyState(key=5, name="w", count=64, dtype="float32", num_workers=2, async_mode=True,
                 compression_params={"compressor": "onebit"})


def test_compressed_key_sums_decoded_pushes_and_refuses_malformed_payloads_intact():
    from gradpress.compressors import build_compressor
    from gradpress.server.store import Payload
    params = {"compressor": "onebit", "ef": "vanilla", "scaling": True}
    k = KeyState(key=5, name="w", count=64, dtype="float32", num_workers=2, compression_params=params)
    worker = build_compressor(params, "worker")  # worker A's (a payload is valid until its key's next compress)
    xa, xb = np.linspace(-1, 1, 64, dtype=np.float32), np.linspace(2, -2, 64, dtype=np.float32)
    ma, ba = worker.compress(xa, key=5, round=0)
    mb, bb = build_compressor(params, "worker").compress(xb, key=5, round=0)
    k.push(A, 0, Payload(ma, [np.asarray(b).tobytes() for b in ba]))
    before = k.acc.copy()
    for meta, bufs in [(mb, [np.asarray(bb[0]).tobytes()]),           # a buffer missing
                       (mb, [b"\x00" * 3, np.asarray(bb[1]).tobytes()]),  # a scale of 3 bytes
                       ({"codec": "onebit", "n": 65}, [np.asarray(b).tobytes() for b in bb])]:  # wrong length
        with pytest.raises(PushError, match="malformed onebit payload"):
            k.push(B, 0, Payload(meta, bufs))
        assert np.array_equal(k.acc, before), "a refused payload changed the sum"
    with pytest.raises(PushError, match="encoded as"):
        k.decode({"dtype": "float32", "count": 64}, [xb.tobytes()])  # raw values for a compressed key
    k.push(B, 0, Payload(mb, [np.asarray(b).tobytes() for b in bb]))
    [reply] = k.pull(A, 0)
    assert reply.fields["codec"] == "onebit" and reply.buffers, reply.fields
    out = np.empty(64, np.float32)
    worker.decompress(reply.fields["meta"], reply.buffers, out, key=5, round=0)
    total = np.abs(xa).mean() * np.where(xa < 0, -1, 1) + np.abs(xb).mean() * np.where(xb < 0, -1, 1)
    want = np.abs(total).mean() * np.where(total < 0, -1, 1)  # the server compresses the sum again
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_shared_results_carry_the_round_in_progress_and_are_read_in_place():
    from gradpress.net.shm import Arena
    from gradpress.server.sink import SharedSlots
    k = key(workers=2)
    arena = Arena("s", chunk_bytes=4096)
    seg = arena.alloc(2 * 5 * 4)
    try:
        k.push(A, 0, arr(1))  # before the slots exist: the partial sum must carry over
        slots = SharedSlots(k.key, 5, "float32", seg)
        slots.readers.add(A)
        k.share_results(slots)
        assert k.acc is slots.slots[0], "an fp32 key must sum straight into its shared slot"
        [reply] = k.push(B, 0, arr(2)) + k.pull(A, 0)
        assert reply.fields["shm"] == seg.ref and reply.fields["slot"] == 0 and reply.buffers == []
        assert np.all(slots.slots[0] == 3)
        [framed] = k.pull(B, 0)  # a worker on another host still gets the values in a frame
        assert np.all(framed.buffers[0] == 3) and "shm" not in framed.fields
        k.push(A, 1, arr(10))
        k.push(B, 1, arr(20))
        assert k.pull(A, 1)[0].fields["slot"] == 1 and np.all(slots.slots[1] == 30)
        assert np.all(slots.slots[0] == 3), "round 1 overwrote round 0's slot"
    finally:
        arena.close()


def test_compressed_keys_refuse_shared_results():
    params = {"compressor": "onebit", "ef": "vanilla", "scaling": True}
    k = KeyState(key=5, name="w", count=64, dtype="float32", num_workers=2, compression_params=params)
    with pytest.raises(PushError, match="compressed keys travel in frames"):
        k.share_results(None)


@pytest.mark.parametrize("refused_first", [True, False])
def test_a_refused_push_fails_its_round_for_every_worker_and_the_next_round_is_whole(refused_first):
    """A worker whose codec refused its round (NaN/inf under error feedback) pushes no data:
    every pull of the round gets an ERROR naming it, the server's residual is as it was, and
    the next round (held early or pushed after) sums every worker's values alone."""
    from gradpress.compressors import build_compressor
    from gradpress.server.store import Payload, Refused
    params = {"compressor": "onebit", "ef": "vanilla", "scaling": True}
    k = KeyState(key=5, name="w", count=64, dtype="float32", num_workers=2, compression_params=params)
    codecs = {w: build_compressor(params, "worker") for w in (A, B)}
    sent = {}

    def payload(w, x, rnd):
        meta, bufs = codecs[w].compress(x, key=5, round=rnd)
        sent[(w, rnd)] = Payload(meta, [np.asarray(b).tobytes() for b in bufs])
        return sent[(w, rnd)]
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    pushes = [(A, Refused("worker 1 (key 5: error feedback met NaN/inf)")), (B, payload(B, x, 0))]
    for sender, values in (pushes if refused_first else pushes[::-1]):
        k.push(sender, 0, values)
    k.push(B, 1, payload(B, 2 * x, 1))  # B goes on at once: held for round 1
    for who in (A, B):
        [reply] = k.pull(who, 0)
        assert reply.op == Op.ERROR and reply.fields["round"] == 0, reply
        assert "round 0 has no aggregate: refused by worker 1 (key 5: error feedback met NaN/inf)" \
            in reply.fields["message"]
    assert k.server_state()[0] is None, "the refused round took a step of the server's error feedback"
    k.push(A, 1, payload(A, x, 1))
    [reply] = k.pull(A, 1)
    assert reply.op == Op.PULL_REPLY and reply.fields["codec"] == "onebit"
    # the replay: round 1's two pushes decoded and summed, compressed by a server that never stepped
    total = np.zeros(64, np.float32)
    for w in (A, B):
        decoded = np.empty(64, np.float32)
        codecs[w].decompress(sent[(w, 1)].meta, sent[(w, 1)].buffers, decoded, key=5, round=1)
        total += decoded
    meta, bufs = build_compressor(params, "server").compress(total, key=5, round=1)
    assert reply.fields["meta"] == meta and [bytes(b) for b in reply.buffers] == [np.asarray(b).tobytes() for b in bufs]


@pytest.mark.parametrize("order", ["nonfinite first", "nonfinite last", "nonfinite early"])
def test_a_nonfinite_push_skips_its_round_for_every_worker_and_the_next_round_is_whole(order):
    """A worker whose input held NaN/inf (an overflow under loss scaling) pushes ``nonfinite``
    without data: every pull of the round gets a PULL_REPLY marked ``nonfinite`` naming it,
    without data (each worker lands NaN), not an ERROR; the server's residual stays as it
    was, also where the skipped push came early (held for the round); the next round sums
    every worker's values alone. With a refused push in the same round, the round fails."""
    from gradpress.compressors import build_compressor
    from gradpress.server.store import Payload, Refused
    params = {"compressor": "topk", "k": 0.25, "ef": "vanilla"}
    k = KeyState(key=5, name="w", count=64, dtype="float32", num_workers=2, compression_params=params)
    codec = build_compressor(params, "worker")
    x = np.linspace(-1, 1, 64, dtype=np.float32)

    def payload(v, rnd):
        meta, bufs = codec.compress(v, key=5, round=rnd)
        return Payload(meta, [np.asarray(b).tobytes() for b in bufs])
    k.push(A, 0, payload(x, 0))
    k.push(B, 0, payload(x, 0))
    residual = k.server_state()[0].copy()
    skipped = Refused("worker 1 (topk input contains NaN or inf)", overflow=True)
    pushes = [(B, skipped), (A, payload(3 * x, 1))]
    if order == "nonfinite early":  # B is a round ahead: its skipped push waits for round 1's end
        k.push(B, 1, payload(3 * x, 1))
        k.push(B, 2, skipped)
        k.push(A, 1, payload(3 * x, 1))
        assert "nonfinite" not in k.pull(A, 1)[0].fields
        residual = k.server_state()[0].copy()
        k.push(A, 2, payload(x, 2))
        done = 2
    else:
        for sender, values in pushes if order == "nonfinite first" else pushes[::-1]:
            k.push(sender, 1, values)
        done = 1
    for who in (A, B):
        [reply] = k.pull(who, done)
        assert (reply.op, reply.fields["round"], reply.buffers) == (Op.PULL_REPLY, done, [])
        assert reply.fields["nonfinite"] == "worker 1 (topk input contains NaN or inf)"
        assert (reply.fields["dtype"], reply.fields["count"]) == ("float32", 64) and "codec" not in reply.fields
    assert np.array_equal(k.server_state()[0], residual), "the skipped round stepped the server's residual"
    nxt = done + 1
    k.push(A, nxt, payload(x, nxt))
    k.push(B, nxt, payload(x, nxt))
    [reply] = k.pull(A, nxt)
    assert reply.op == Op.PULL_REPLY and reply.fields["codec"] == "topk" and "nonfinite" not in reply.fields
    # a refused push and a nonfinite one in one round: the round fails
    k.push(A, nxt + 1, Refused("worker 0 (its encoder failed on the GPU)"))
    k.push(B, nxt + 1, skipped)
    [reply] = k.pull(B, nxt + 1)
    assert reply.op == Op.ERROR and "refused by worker 0 (its encoder failed" in reply.fields["message"]
