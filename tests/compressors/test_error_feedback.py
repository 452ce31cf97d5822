"""Error feedback and momentum: conservation per step and over T steps, corrected lambda,
Nesterov momentum, checkpointing, and NaN/inf leaving state untouched."""
import numpy as np
import pytest

from gradpress.compressors import ErrorFeedback, Momentum, build_compressor
from gradpress.errors import NonFiniteInput
from tests.compressors.cases import CODEC_PARAMS, decompressed, gaussian

LOSSY = ["onebit-l1", "onebit-l2", "topk-frac", "randomk-scaled", "dither-natural-max", "fp16"]


def params_of(name: str, **extra) -> dict:
    return {**dict(CODEC_PARAMS)[name], **extra}


@pytest.mark.parametrize("name", LOSSY)
@pytest.mark.parametrize("role", ["worker", "server"])
def test_each_step_conserves_and_the_sum_telescopes(name, role):
    c = build_compressor(params_of(name, ef="vanilla"), role)
    n, key, steps = 3000, 17, 12
    sent = np.zeros(n)
    pushed = np.zeros(n)
    residual = np.zeros(n, np.float32)
    for t in range(steps):
        g = gaussian(n, seed=t)
        header, buffers = c.compress(g, key=key, round=t)
        d = decompressed(c, header, buffers, n, key, t).astype(np.float64)
        new_residual = c.residual(key)
        # D(C(g + e)) + e' = g + e
        np.testing.assert_allclose(d + new_residual, g.astype(np.float64) + residual,
                                   rtol=0, atol=2e-6 * (1 + np.abs(d).max()))
        residual = new_residual.copy()
        sent += d
        pushed += g
    # float32 rounding of every step accumulates: relative tolerance
    np.testing.assert_allclose(sent, pushed - residual, rtol=1e-5, atol=1e-4)


def test_corrected_error_feedback_scales_the_residual_by_the_lr_ratio():
    c = build_compressor(params_of("topk-count", ef="corrected"), "worker")
    g0, g1 = gaussian(50, seed=1), gaussian(50, seed=2)
    c.compress(g0, key=3, round=0, lr=0.1)
    e0 = c.residual(3).copy()
    header, buffers = c.compress(g1, key=3, round=1, lr=0.05)  # lambda = 0.1 / 0.05 = 2
    p = g1 + np.float32(2.0) * e0
    np.testing.assert_allclose(decompressed(c, header, buffers, 50) + c.residual(3), p,
                               atol=1e-6)
    assert np.argmax(np.abs(decompressed(c, header, buffers, 50))) == np.argmax(np.abs(p))
    with pytest.raises(ValueError, match="finite lr > 0"):
        c.compress(g1, key=3, round=2)


def test_nesterov_momentum_feeds_p_to_the_codec():
    mu = 0.5
    worker = build_compressor({"compressor": "none", "momentum": "nesterov", "mu": mu},
                              "worker")
    assert isinstance(worker, Momentum)
    m = np.zeros(20)
    for t in range(4):
        g = gaussian(20, seed=t)
        m = mu * m + g
        header, buffers = worker.compress(g, key=1, round=t)
        np.testing.assert_allclose(decompressed(worker, header, buffers, 20), mu * m + g,
                                   rtol=1e-6)


def test_server_ignores_momentum():
    server = build_compressor({"compressor": "none", "momentum": "nesterov"}, "server")
    g = gaussian(20)
    np.testing.assert_array_equal(decompressed(server, *server.compress(g, key=1, round=0), 20),
                                  g)


def test_state_is_per_key():
    c = build_compressor(params_of("onebit-l1", ef="vanilla"), "server")
    c.compress(gaussian(100, seed=1), key=1, round=0)
    c.compress(gaussian(30, seed=2), key=2, round=0)
    assert c.residual(1).shape == (100,) and c.residual(2).shape == (30,)
    with pytest.raises(ValueError, match="key 2"):
        c.compress(gaussian(31), key=2, round=1)


def test_state_dict_round_trip_continues_identically():
    params = params_of("topk-frac", ef="corrected", momentum="nesterov")
    a = build_compressor(params, "worker")
    for t in range(3):
        a.compress(gaussian(200, seed=t), key=4, round=t, lr=0.1 / (t + 1))
    state = a.state_dict()
    assert set(state["momenta"]) == {4} and set(state["inner"]["residuals"]) == {4}
    b = build_compressor(params, "worker")
    b.load_state_dict(state)
    g = gaussian(200, seed=9)
    ha, ba = a.compress(g, key=4, round=3, lr=0.02)
    hb, bb = b.compress(g, key=4, round=3, lr=0.02)
    assert ha == hb
    for x, y in zip(ba, bb):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", ["none", "fp16", "onebit-l1", "randomk", "dither-linear-l2"])
@pytest.mark.parametrize("role", ["worker", "server"])
def test_non_finite_input_raises_and_leaves_state_untouched(name, role):
    c = build_compressor(params_of(name, ef="vanilla", momentum="nesterov"), role)
    c.compress(gaussian(100, seed=1), key=1, round=0)
    before = c.state_dict()
    bad = gaussian(100, seed=2)
    bad[50] = np.nan
    with pytest.raises(NonFiniteInput, match="NaN"):  # (a ValueError: a round skipped, not a job failed)
        c.compress(bad, key=1, round=1)
    after = c.state_dict()
    for part in ("momenta", "residuals"):
        holder_before = before.get(part) or before.get("inner", {}).get(part, {})
        holder_after = after.get(part) or after.get("inner", {}).get(part, {})
        for key in holder_before:
            np.testing.assert_array_equal(holder_before[key], holder_after[key])


def test_fp16_overflow_is_caught_before_it_poisons_the_residual():
    c = ErrorFeedback(build_compressor({"compressor": "fp16"}, "server"))
    with pytest.raises(ValueError, match="overflowed"):
        c.compress(np.array([1.0, 1e6], np.float32), key=0, round=0)
    assert c.residual(0) is None


@pytest.mark.parametrize("name", ["onebit-l1", "topk-frac", "dither-linear-l2", "fp16", "randomk"])
@pytest.mark.parametrize("extra", [{"ef": "vanilla"}, {"ef": "corrected", "momentum": "nesterov"}, {}])
def test_restart_after_a_skipped_round_starts_the_key_as_new_and_leaves_the_others(name, extra):
    """A round skipped on every worker (worker/nonfinite.py): ``restart(key)`` drops that key's
    residual and momentum, so its next step gives what a fresh compressor's first step gives,
    bit for bit; another key's state goes on. A codec without state restarts as a no-op. Bare
    codecs that cannot carry NaN/inf raise NonFiniteInput too, which skips rather than fails."""
    params = params_of(name, **extra)
    c = build_compressor(params, "worker")
    for rnd in range(3):
        for key in (1, 2):
            c.compress(gaussian(300, seed=10 * rnd + key), key=key, round=rnd, lr=0.1 / (1 + rnd))
    c.restart(1)
    c.restart(99)  # never compressed: nothing to drop
    other = build_compressor(params, "worker")
    for rnd in range(3):
        other.compress(gaussian(300, seed=10 * rnd + 2), key=2, round=rnd, lr=0.1 / (1 + rnd))
    fresh = build_compressor(params, "worker")
    x = gaussian(300, seed=77)
    for key, twin in ((1, fresh), (2, other)):
        got, want = c.compress(x, key=key, round=3, lr=0.02), twin.compress(x, key=key, round=3, lr=0.02)
        assert got[0] == want[0] and [np.asarray(b).tobytes() for b in got[1]] == \
            [np.asarray(b).tobytes() for b in want[1]], f"key {key}"
    bad = gaussian(300, seed=5)
    bad[7] = np.inf
    if params["compressor"] not in ("randomk", "fp16") or extra:  # (those two carry an inf bare)
        with pytest.raises(NonFiniteInput):
            c.compress(bad, key=3, round=0, lr=0.1)


@pytest.mark.parametrize("ef", [None, "vanilla"])
def test_dithering_refuses_finite_values_whose_l2_norm_overflows(ef):
    """1024 values of 2e37 are finite, their l2 norm (6.4e38) is not a float32: a payload with
    an infinite norm would be refused by every decoder (a server's PushError for one worker,
    the others waiting out the round). It raises NonFiniteInput, so the round is skipped,
    and the state stays as it was."""
    params = {**dict(CODEC_PARAMS)["dither-linear-l2"], **({"ef": ef} if ef else {})}
    c = build_compressor(params, "server")
    c.compress(gaussian(1024, seed=1), key=1, round=0)
    before = c.state_dict() if ef else None
    with pytest.raises(NonFiniteInput, match="l2 norm|codec overflowed"):
        c.compress(np.full(1024, 2e37, np.float32), key=1, round=1)
    if ef:
        assert np.array_equal(c.state_dict()["residuals"][1], before["residuals"][1])
