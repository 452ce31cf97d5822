"""A key checks what a push or a restored state carries when it arrives, whatever its round."""
import numpy as np
import pytest

from gradpress.compressors import build_compressor
from gradpress.net.protocol import Op
from gradpress.server.store import KeyState, Payload, PushError

A, B = b"worker-a", b"worker-b"
ONEBIT = {"compressor": "onebit", "scaling": True}


def _payload(worker, x, rnd):
    meta, bufs = worker.compress(x, key=5, round=rnd)
    return Payload(meta, [np.asarray(b).tobytes() for b in bufs])


def test_a_malformed_push_for_the_next_round_is_refused_on_arrival_and_the_round_completes():
    k = KeyState(key=5, name="w", count=64, dtype="float32", num_workers=2, compression_params=ONEBIT)
    worker = build_compressor(ONEBIT, "worker")
    x = np.full(64, 3.0, np.float32)
    k.push(A, 0, _payload(worker, x, 0))
    bad = _payload(worker, x, 1)
    with pytest.raises(PushError, match="malformed onebit payload for round 1"):
        k.push(A, 1, Payload(bad.meta, [bad.buffers[0], b"\1\2\3"]))  # sign bits cut short
    assert A not in k.early
    replies = k.push(B, 0, _payload(worker, x, 0))  # round 0 completes: nothing of A's bad push
    assert k.done_round == 0 and not [r for r in replies if r.op == Op.ERROR], replies
    k.push(A, 1, _payload(worker, x, 1))  # a good early push is kept (decoded) and summed later
    k.push(B, 1, _payload(worker, x, 1))
    [reply] = k.pull(A, 1)
    out = np.empty(64, np.float32)
    worker.decompress(reply.fields["meta"], reply.buffers, out, key=5, round=1)
    assert np.all(out == 6.0), out[:4]


def test_a_learning_rate_is_checked_on_arrival():
    params = {"compressor": "onebit", "ef": "corrected", "scaling": True}
    k = KeyState(key=5, name="w", count=8, dtype="float32", num_workers=2, compression_params=params)
    header = {"dtype": "float32", "count": 8, "codec": "onebit", "meta": {}}
    with pytest.raises(PushError, match="corrected error feedback needs"):
        k.decode(header, [])
    with pytest.raises(PushError, match="learning rate nan"):  # (checked as the push is taken)
        k.push(b"w0", 0, k.decode(dict(header, lr=float("nan")), []), float("nan"))
    assert not k.pushed
    with pytest.raises(PushError, match="NaN or inf"):
        k.load_server_state(np.full(8, np.inf, np.float32), 0.1)
    with pytest.raises(PushError, match="learning rate -1"):
        k.load_server_state(np.zeros(8, np.float32), -1.0)
