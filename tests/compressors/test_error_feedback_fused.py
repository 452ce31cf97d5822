"""Error feedback fused into the codecs' kernels against the generic wrapper steps
(``ErrorFeedback(..., fused=False)``): identical payload bytes and identical residual
bytes, every lossy codec, both kinds, worker (with momentum) and server; NaN/inf refused
with the state unchanged on both paths. (The CUDA kernels: cudasim_payloads.py.)"""
import numpy as np
import pytest

from gradpress.compressors import ErrorFeedback, Momentum, build_compressor
from tests.compressors.cases import CODEC_PARAMS, gaussian

LOSSY = [name for name, _ in CODEC_PARAMS if name != "none"]
# 0 and 1 travel raw (the generic steps run); the others cover partial bytes, chunk and
# block edges (4096) and the strided sample of top-k's estimate (n > 4096)
LENGTHS = [0, 1, 2, 7, 9, 17, 300, 4095, 4097, 3 * 4096 + 17, 70001]


def pair(name: str, kind: str) -> tuple:
    params = dict(CODEC_PARAMS)[name]
    corrected = kind == "corrected"
    return (ErrorFeedback(build_compressor(params, "server"), corrected, fused=True),
            ErrorFeedback(build_compressor(params, "server"), corrected, fused=False))


def steps(n: int, count: int = 3):
    """(gradient, lr) per step: gaussian, wide-ranged, then many equal magnitudes (ties)."""
    rng = np.random.default_rng(n)
    inputs = [gaussian(n, seed=n),
              (gaussian(n, seed=n + 1) * np.float32(10.0) ** rng.integers(-3, 4, n)
               ).astype(np.float32),
              np.round(gaussian(n, seed=n + 2)).astype(np.float32)]
    for t in range(count):
        yield inputs[t % len(inputs)], 0.1 / (1 + t) ** 2


def payload_bytes(header: dict, buffers: list) -> tuple:
    return header, [bytes(memoryview(b).cast("B")) for b in buffers]


def assert_same_step(fused, generic, g, key, t, lr, what):
    got = payload_bytes(*fused.compress(g, key=key, round=t, lr=lr))
    want = payload_bytes(*generic.compress(g, key=key, round=t, lr=lr))
    assert got == want, f"{what}: payloads differ"
    assert fused.residual(key).tobytes() == generic.residual(key).tobytes(), \
        f"{what}: residuals differ"


@pytest.mark.parametrize("kind", ["vanilla", "corrected"])
@pytest.mark.parametrize("name", LOSSY)
def test_fused_kernels_match_the_generic_steps_byte_for_byte(name, kind):
    for n in LENGTHS:
        fused, generic = pair(name, kind)
        for t, (g, lr) in enumerate(steps(n)):
            assert_same_step(fused, generic, g, 5, t, lr, f"n={n} step {t}")


@pytest.mark.parametrize("name", LOSSY)
def test_the_fused_kernels_really_run(name):
    # compress_with_feedback answers None where the generic steps must run instead
    codec = build_compressor(dict(CODEC_PARAMS)[name], "server")
    g, e = gaussian(300, seed=1), gaussian(300, seed=2)
    assert codec.compress_with_feedback(g, e, 1.0, np.empty(300, np.float32), 1, 0) \
        is not None
    assert codec.compress_with_feedback(g[:0], e[:0], 1.0, np.empty(0, np.float32), 1, 0) \
        is None
    assert codec.compress_with_feedback(g.astype(np.float64), e.astype(np.float64), 1.0,
                                        np.empty(300), 1, 0) is None


@pytest.mark.parametrize("name", ["onebit-l1", "topk-frac", "randomk-scaled",
                                  "dither-natural-max", "fp16"])
def test_worker_momentum_over_fused_feedback_matches_the_generic_steps(name):
    params = {**dict(CODEC_PARAMS)[name], "ef": "corrected", "momentum": "nesterov"}
    fused = build_compressor(params, "worker")
    generic = Momentum(ErrorFeedback(build_compressor(dict(CODEC_PARAMS)[name], "server"),
                                     corrected=True, fused=False), mu=fused.mu)
    assert isinstance(fused.inner, ErrorFeedback) and fused.inner.fused
    for t, (g, lr) in enumerate(steps(5000, count=4)):
        got = payload_bytes(*fused.compress(g, key=2, round=t, lr=lr))
        want = payload_bytes(*generic.compress(g, key=2, round=t, lr=lr))
        assert got == want, f"step {t}: payloads differ"
    assert fused.inner.residual(2).tobytes() == generic.inner.residual(2).tobytes()


def state_of(c: ErrorFeedback) -> tuple:
    state = c.state_dict()
    return ({k: v.tobytes() for k, v in state["residuals"].items()}, dict(state["lrs"]))


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("where", ["g", "e"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", LOSSY)
def test_non_finite_g_or_e_is_refused_and_the_state_is_unchanged(name, bad, where, fused):
    c, _ = pair(name, "corrected")
    c.fused = fused
    n = 5000
    c.compress(gaussian(n, seed=1), key=1, round=0, lr=0.1)
    g = gaussian(n, seed=2)
    if where == "g":
        g[4321] = bad
    else:  # a residual poisoned from outside (a checkpoint): it must not spread either
        residuals, lrs = c.state_dict()["residuals"], c.state_dict()["lrs"]
        residuals[1][77] = bad
        c.load_state_dict({"residuals": residuals, "lrs": lrs})
    before = state_of(c)
    with pytest.raises(ValueError, match="NaN"):
        c.compress(g, key=1, round=1, lr=0.05)
    assert state_of(c) == before
    # and the key goes on from the unchanged state (same as a fresh wrapper given it)
    if where == "g":
        _, reference = pair(name, "corrected")
        reference.load_state_dict(c.state_dict())
        assert_same_step(c, reference, gaussian(n, seed=3), 1, 2, 0.05, "after refusal")


def test_fp16_overflow_is_refused_by_the_fused_kernel_too():
    c, _ = pair("fp16", "vanilla")
    with pytest.raises(ValueError, match="overflowed"):
        c.compress(np.array([1.0, 1e6, 3.0], np.float32), key=0, round=0)
    assert c.residual(0) is None


@pytest.mark.parametrize("name", ["onebit-l2", "dither-linear-max"])
def test_in_place_codecs_update_the_residual_they_were_given(name):
    # onebit and dithering check p in pass 1, so pass 2 may overwrite e: no spare needed
    fused, generic = pair(name, "vanilla")
    for t, (g, lr) in enumerate(steps(9000)):
        before = fused.residual(3)
        assert_same_step(fused, generic, g, 3, t, lr, f"step {t}")
        if before is not None:
            assert fused.residual(3) is before


@pytest.mark.parametrize("name,index", [("fp16", 0), ("onebit-l1", 1), ("dither-natural-max", 1)])
def test_a_keys_payload_is_written_over_its_last_one(name, index):
    # the large payloads: a fresh one per call is a fresh mapping the kernel must zero
    fused, generic = pair(name, "vanilla")
    first = fused.compress(gaussian(9000, seed=1), key=3, round=0)[1][index]
    other = fused.compress(gaussian(9000, seed=2), key=4, round=0)[1][index]
    assert not np.shares_memory(first, other), "two keys share a payload"
    generic.compress(gaussian(9000, seed=1), key=3, round=0)
    assert_same_step(fused, generic, gaussian(9000, seed=5), 3, 1, None, "reused")
    assert fused.compress(gaussian(9000, seed=6), key=3, round=2)[1][index] is first
