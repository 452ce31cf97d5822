"""A random-k key summed where its values live (gradpress/server/values_sum.py) gives the
bytes the dense path gives: every reply's payload, the server's residual and its learning
rate, round after round, through the cases that hand a round to the dense path."""
import numpy as np
import pytest

from gradpress.compressors import build_compressor
from gradpress.server.store import KeyState, Payload, PushError

A, B, C = b"A", b"B", b"C"
N = 3001  # not a multiple of 64: the bitmap's last word is partial


def pair(params, workers=3):
    """The same key twice: summed where its values live, and forced onto the dense path."""
    states = [KeyState(key=7, name="w", count=N, dtype="float32", num_workers=workers,
                       compression_params=params) for _ in range(2)]
    assert states[0].values_sum is not None
    states[1].values_sum = None
    return states


def gradient(rng, round):
    g = rng.standard_normal(N).astype(np.float32)
    g[rng.integers(0, N, 200)] = -0.0  # signed zeros: x + 0.0 turns -0.0 into +0.0
    g[rng.integers(0, N, 50)] = 0.0
    if round == 2:
        g[:N // 3] = 0.0  # whole chosen values zero in one worker
    if round == 3:
        g[N // 2:] = -0.0  # every worker sends -0.0 there (without its own error feedback)
    return g


def payload(compressor, g, round, lr=None):
    meta, buffers = compressor.compress(g, key=7, round=round, lr=lr)
    return Payload(meta, [np.asarray(b).tobytes() for b in buffers])


def reply_bytes(state, sender, rnd):
    [reply] = state.pull(sender, rnd)
    return reply.fields, [bytes(memoryview(np.ascontiguousarray(b))) for b in reply.buffers]


def same_state(sparse, dense):
    assert sparse.failure == dense.failure
    r_s, lr_s = sparse.server_state()
    r_d, lr_d = dense.server_state()
    assert lr_s == lr_d
    if r_d is None:
        assert r_s is None
    else:
        assert r_s.tobytes() == r_d.tobytes(), "residuals differ"


@pytest.mark.parametrize("params", [
    {"compressor": "randomk", "k": 0.05, "ef": "vanilla", "seed": 3},
    {"compressor": "randomk", "k": 0.05, "ef": "corrected", "seed": 3},
    {"compressor": "randomk", "k": 40, "seed": 9},  # no error feedback
])
@pytest.mark.parametrize("worker_ef", [True, False])
def test_summed_values_give_the_dense_paths_bytes_round_after_round(params, worker_ef):
    rng = np.random.default_rng(0)
    states = pair(params)
    sent_by = params if worker_ef else {k: v for k, v in params.items() if k != "ef"}
    workers = {w: build_compressor(sent_by, "worker") for w in (A, B, C)}
    for rnd in range(5):
        lr = 0.1 / (rnd + 1)
        pushes = {w: payload(c, gradient(rng, rnd), rnd, lr) for w, c in workers.items()}
        for state in states:
            for w, p in pushes.items():
                state.push(w, rnd, p, lr=lr)
        assert states[0].values_sum.active is False  # consumed by the round's compression
        assert reply_bytes(states[0], A, rnd) == reply_bytes(states[1], A, rnd)
        same_state(*states)
    # the sparse key never touched its dense accumulators
    assert not states[0].acc.any()


def test_a_push_with_another_seed_hands_the_round_to_the_dense_path_and_for_good():
    params = {"compressor": "randomk", "k": 0.05, "ef": "vanilla", "seed": 3}
    other = dict(params, seed=4)
    rng = np.random.default_rng(1)
    states = pair(params)
    compressors = {A: build_compressor(params, "worker"), B: build_compressor(other, "worker"),
                   C: build_compressor(params, "worker")}
    for rnd in range(3):
        pushes = {w: payload(c, gradient(rng, rnd), rnd) for w, c in compressors.items()}
        for state in states:
            for w in (A, B, C):  # B, in the middle, does not match: the sum so far spills
                state.push(w, rnd, pushes[w])
        assert reply_bytes(states[0], A, rnd) == reply_bytes(states[1], A, rnd)
        same_state(*states)
        assert states[0].values_sum.enabled is False  # the residual is no longer zero


def test_a_push_decoded_early_takes_its_round_dense_and_the_next_round_sums_values_again():
    params = {"compressor": "randomk", "k": 0.05, "ef": "vanilla", "seed": 3}
    rng = np.random.default_rng(2)
    states = pair(params, workers=2)
    a, b = build_compressor(params, "worker"), build_compressor(params, "worker")
    g = {(w, r): gradient(rng, r) for w in (A, B) for r in range(3)}
    for state in states:
        state.push(A, 0, payload(a, g[A, 0], 0))
    pa1 = payload(a, g[A, 1], 1)
    pb0, pb1 = payload(b, g[B, 0], 0), payload(b, g[B, 1], 1)
    for state in states:
        state.push(A, 1, pa1)  # A races ahead: decoded at once, summed densely in round 1
        state.push(B, 0, pb0)
    assert reply_bytes(states[0], A, 0) == reply_bytes(states[1], A, 0)
    for state in states:
        state.push(B, 1, pb1)
    assert reply_bytes(states[0], B, 1) == reply_bytes(states[1], B, 1)
    same_state(*states)
    assert states[0].values_sum.enabled  # that dense round left a zero residual
    pa2, pb2 = payload(a, g[A, 2], 2), payload(b, g[B, 2], 2)
    for state in states:
        state.push(A, 2, pa2)
        state.push(B, 2, pb2)
    assert states[0].values_sum.active is False
    assert reply_bytes(states[0], A, 2) == reply_bytes(states[1], A, 2)
    same_state(*states)


def test_an_overflowing_sum_skips_the_round_on_both_paths_and_the_next_round_goes_on():
    """Finite pushes whose sum overflows: the round is skipped alike on both paths (a
    ``nonfinite`` reply without data, the server's residual as it was), as a worker's
    NaN/inf push skips it (store.py)."""
    params = {"compressor": "randomk", "k": 0.05, "ef": "vanilla", "seed": 3}
    states = pair(params, workers=2)
    big = np.full(N, 3e38, np.float32)
    a, b = build_compressor(params, "worker"), build_compressor(params, "worker")
    pa, pb = payload(a, big, 0), payload(b, big, 0)
    for state in states:
        state.push(A, 0, pa)
        state.push(B, 0, pb)
    fields, data = reply_bytes(states[0], A, 0)
    assert "NaN/inf" in fields["nonfinite"] and data == [] and states[0].skipped == states[1].skipped
    assert not states[0].failure
    same_state(*states)
    rng = np.random.default_rng(3)
    pa, pb = payload(a, gradient(rng, 1), 1), payload(b, gradient(rng, 1), 1)
    for state in states:
        state.push(A, 1, pa)
        state.push(B, 1, pb)
    assert reply_bytes(states[0], A, 1) == reply_bytes(states[1], A, 1)
    same_state(*states)


def test_a_malformed_push_is_refused_and_leaves_the_sum_intact():
    params = {"compressor": "randomk", "k": 0.05, "ef": "vanilla", "seed": 3}
    states = pair(params, workers=2)
    rng = np.random.default_rng(4)
    a, b = build_compressor(params, "worker"), build_compressor(params, "worker")
    pa, pb = payload(a, gradient(rng, 0), 0), payload(b, gradient(rng, 0), 0)
    for state in states:
        state.push(A, 0, pa)
        before = state.values_sum.sum.copy() if state.values_sum else state.acc.copy()
        for bad in (Payload(pb.meta, [pb.buffers[0][:-4]]),                        # a value short
                    Payload(dict(pb.meta, k=N + 1), pb.buffers),                   # k above n
                    Payload(pb.meta, [np.full(len(pb.buffers[0]) // 4, np.inf, np.float32).tobytes()])):
            with pytest.raises(PushError, match="malformed randomk payload"):
                state.push(B, 0, bad)
        after = state.values_sum.sum if state.values_sum else state.acc
        assert after.tobytes() == before.tobytes()
        state.push(B, 0, pb)
    assert reply_bytes(states[0], A, 0) == reply_bytes(states[1], A, 0)


@pytest.mark.parametrize("nonzero", [False, True])
def test_a_restored_residual_decides_which_path_sums(nonzero):
    params = {"compressor": "randomk", "k": 0.05, "ef": "vanilla", "seed": 3}
    states = pair(params, workers=2)
    residual = np.zeros(N, np.float32)
    if nonzero:
        residual[5] = 0.25
    for state in states:
        state.load_server_state(residual, 0.1)
    assert states[0].values_sum.enabled is not nonzero
    rng = np.random.default_rng(5)
    a, b = build_compressor(params, "worker"), build_compressor(params, "worker")
    for rnd in range(2):
        pa, pb = payload(a, gradient(rng, rnd), rnd), payload(b, gradient(rng, rnd), rnd)
        for state in states:
            state.push(A, rnd, pa)
            state.push(B, rnd, pb)
        assert reply_bytes(states[0], A, rnd) == reply_bytes(states[1], A, rnd)
        same_state(*states)


def test_keys_that_cannot_sum_their_values_keep_the_dense_path():
    for params in ({"compressor": "randomk", "k": 0.05, "scaling": True},  # scaled: residual moves
                   {"compressor": "topk", "k": 0.05},                        # indices differ per worker
                   {"compressor": "randomk", "k": N}):                       # raw payloads
        state = KeyState(key=7, name="w", count=N, dtype="float32", num_workers=2, compression_params=params)
        assert state.values_sum is None, params
