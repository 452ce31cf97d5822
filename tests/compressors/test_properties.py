"""Properties every codec must have (DESIGN.md section 7), on random and edge-case input."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from gradpress.compressors import ErrorFeedback, payload_nbytes
from tests.compressors.cases import (
    CODEC_IDS, EDGE_LENGTHS, codec, decompressed, gaussian)

finite_floats = st.floats(-1e6, 1e6, allow_nan=False, width=32)
vectors = arrays(np.float32, st.integers(0, 300), elements=finite_floats)


@pytest.mark.parametrize("name", CODEC_IDS)
@settings(max_examples=25, deadline=None)
@given(x=vectors, key=st.integers(0, 2 ** 40), round=st.integers(0, 1000))
def test_roundtrip_keeps_shape_dtype_and_size_bound(name, x, key, round):
    c = codec(name)
    header, buffers = c.compress(x, key=key, round=round)
    assert header["codec"] == c.name and header["n"] == x.shape[0]
    assert all(isinstance(b, np.ndarray) and b.flags.c_contiguous for b in buffers)
    assert payload_nbytes(buffers) <= x.nbytes, "payload larger than the raw array"
    for dtype in (np.float16, np.float32, np.float64):
        out = decompressed(c, header, buffers, x.shape[0], key, round, dtype)
        assert out.shape == x.shape and out.dtype == dtype
        if name != "fp16" and dtype != np.float16:  # 1e6 overflows half precision
            assert np.isfinite(out).all()


@pytest.mark.parametrize("name", CODEC_IDS)
@pytest.mark.parametrize("n", EDGE_LENGTHS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_edge_lengths_and_dtypes(name, n, dtype):
    c = codec(name)
    x = gaussian(n, seed=n, dtype=dtype)
    header, buffers = c.compress(x, key=5, round=1)
    assert payload_nbytes(buffers) <= x.nbytes
    if n > 0 and payload_nbytes(buffers) == x.nbytes:
        assert "raw" in header or name == "none", "equal-size payload must be the raw array"
    out = decompressed(c, header, buffers, n, 5, 1)
    acc = np.ones(n, np.float32)
    c.decompress_add(header, buffers, acc, key=5, round=1)
    np.testing.assert_array_equal(acc, np.float32(1) + out)


@pytest.mark.parametrize("name", CODEC_IDS)
def test_all_zeros(name):
    x = np.zeros(1000, np.float32)
    c = codec(name)
    header, buffers = c.compress(x, key=1, round=1)
    out = decompressed(c, header, buffers, 1000, 1, 1)
    if name == "onebit":  # no scaling: s = 1 and sign(0) = +1
        np.testing.assert_array_equal(out, np.ones(1000, np.float32))
    else:
        np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("name", ["onebit", "onebit-l1", "onebit-l2"])
def test_onebit_is_scaled_sign_with_sign_of_zero_positive(name):
    x = np.array([-2.0, -0.0, 0.0, 3.0, -1.0, 4.0, 0.5, -0.5, 1.0], np.float32)
    c = codec(name)
    header, buffers = c.compress(x, key=0, round=0)
    scale = {"onebit": 1.0, "onebit-l1": np.abs(x).sum() / 9,
             "onebit-l2": np.sqrt((x.astype(np.float64) ** 2).sum() / 9)}[name]
    expected = np.where(x < 0, -scale, scale).astype(np.float32)
    np.testing.assert_array_equal(decompressed(c, header, buffers, 9), expected)
    assert payload_nbytes(buffers) == 4 + 2


@settings(max_examples=40, deadline=None)
@given(x=arrays(np.float32, st.integers(10, 300), elements=finite_floats),
       fraction=st.floats(0.01, 0.4))
def test_topk_keeps_the_k_largest_and_contracts(x, fraction):
    from gradpress.compressors.topk import TopK
    c = TopK(fraction)
    header, buffers = c.compress(x, key=0, round=0)
    k = header["k"]
    assert k == min(x.shape[0], max(1, int(np.ceil(fraction * x.shape[0]))))
    out = decompressed(c, header, buffers, x.shape[0])
    indices = np.asarray(buffers[0])
    assert len(np.unique(indices)) == k
    smallest_kept = np.abs(x[indices]).min()
    dropped = np.setdiff1d(np.arange(x.shape[0]), indices)
    assert dropped.size == 0 or np.abs(x[dropped]).max() <= smallest_kept
    np.testing.assert_array_equal(out[indices], x[indices])
    np.testing.assert_array_equal(out[dropped], 0)
    x64 = x.astype(np.float64)
    assert ((x64 - out) ** 2).sum() <= (1 - k / x.shape[0]) * (x64 ** 2).sum() * (1 + 1e-9)


def test_topk_with_k_at_least_half_sends_the_raw_array():
    from gradpress.compressors.topk import TopK
    x = gaussian(10)
    header, buffers = TopK(5).compress(x, key=0, round=0)  # 5 pairs = 40 bytes = raw size
    assert header["raw"] == "float32"
    np.testing.assert_array_equal(decompressed(TopK(5), header, buffers, 10), x)


def test_topk_ties_prefer_lower_indices():
    from gradpress.compressors.topk import TopK
    x = np.array([1, -3, 3, 2, -3, 3, 1, 0, 0, 0], np.float32)
    header, buffers = TopK(3).compress(x, key=0, round=0)
    assert list(buffers[0]) == [1, 2, 4]


def test_randomk_indices_are_shared_by_independent_instances_and_vary_by_round():
    x = gaussian(10_000)
    params = {"compressor": "randomk", "k": 0.01, "seed": 42}
    from gradpress.compressors import build_compressor
    a, b = build_compressor(params, "worker"), build_compressor(params, "server")
    ha, ba = a.compress(x, key=9, round=3)
    hb, bb = b.compress(x, key=9, round=3)
    np.testing.assert_array_equal(ba[0], bb[0])
    da, db = decompressed(a, ha, ba, x.shape[0], 9, 3), decompressed(b, hb, bb, x.shape[0], 9, 3)
    np.testing.assert_array_equal(da, db)
    support = np.flatnonzero(da)
    assert len(support) == 100
    other = decompressed(a, *a.compress(x, key=9, round=4), x.shape[0], 9, 4)
    assert not np.array_equal(np.flatnonzero(other), support), "round must change the indices"


def test_randomk_indices_are_distinct_and_cover_the_range_uniformly():
    from gradpress.compressors.randomk import chosen_indices
    counts = np.zeros(50, np.int64)
    for round in range(2000):
        indices = chosen_indices(50, 10, seed=1, key=2, round=round)
        assert len(np.unique(indices)) == 10 and np.all(np.diff(indices.astype(int)) > 0)
        counts[indices] += 1
    expected = 2000 * 10 / 50  # binomial, sigma ~ 12.6
    assert np.abs(counts - expected).max() < 6 * np.sqrt(expected * (1 - 10 / 50))


@pytest.mark.parametrize("name", ["dither-linear-max", "dither-natural-l2"])
def test_dithering_values_lie_on_the_levels_around_the_input(name):
    x = gaussian(3000, seed=4)
    c = codec(name)
    header, buffers = c.compress(x, key=0, round=0)
    norm = np.float64(buffers[0][0])
    out = decompressed(c, header, buffers, 3000).astype(np.float64)
    s = header["s"]
    if header["partition"] == "linear":
        levels = np.arange(s + 1) * norm / s
    else:
        levels = np.concatenate([[0.0], norm * 2.0 ** np.arange(1 - s, 1)])
    lower = levels[np.searchsorted(levels, np.abs(x), side="right") - 1]
    upper = levels[np.minimum(np.searchsorted(levels, np.abs(x), side="left"), s)]
    magnitude = np.abs(out)
    on_lower = np.isclose(magnitude, lower, rtol=1e-6)
    on_upper = np.isclose(magnitude, upper, rtol=1e-6)
    assert np.all(on_lower | on_upper)
    assert np.all((np.sign(out) == np.sign(x)) | (out == 0))


def test_fp16_payload_is_numpy_astype_bits_including_overflow_and_nan():
    x = np.array([1.0, 65504.0, 65520.0, 1e-8, -np.inf, np.nan, 3.14159, -0.0], np.float32)
    header, buffers = codec("fp16").compress(x, key=0, round=0)
    np.testing.assert_array_equal(buffers[0], x.astype(np.float16).view(np.uint16))
    x64 = gaussian(100, dtype=np.float64) * 1000
    _, buffers = codec("fp16").compress(x64, key=0, round=0)
    np.testing.assert_array_equal(buffers[0], x64.astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("name", ["onebit", "onebit-l1", "topk-frac", "dither-linear-max",
                                  "dither-natural-l2"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_is_rejected_by_norm_and_selection_codecs(name, bad):
    x = gaussian(100)
    x[37] = bad
    with pytest.raises(ValueError, match="NaN or inf"):
        codec(name).compress(x, key=0, round=0)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_randomk_rejects_non_finite_values_it_would_send_and_ignores_the_rest(bad):
    c = codec("randomk")
    x = gaussian(100)
    sent = np.flatnonzero(decompressed(c, *c.compress(x, key=0, round=0), 100))
    unsent = np.setdiff1d(np.arange(100), sent)
    x[unsent[0]] = bad
    np.testing.assert_array_equal(c.compress(x, key=0, round=0)[1][0], x[sent])
    x[sent[0]] = bad
    with pytest.raises(ValueError, match="NaN or inf"):
        c.compress(x, key=0, round=0)


@pytest.mark.parametrize("name", ["none", "fp16"])
def test_non_finite_input_passes_through_cast_codecs(name):
    x = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    c = codec(name)
    out = decompressed(c, *c.compress(x, key=0, round=0), 4)
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("name", CODEC_IDS)
@pytest.mark.parametrize("divisor", [2, 3, 7, 1000])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_decompress_with_a_divisor_is_decompress_then_divide(name, divisor, dtype):
    """A worker's average lands with the pull (``decompress(..., divisor=d)``): the same
    bits as decompressing and then dividing the output in its own dtype, as workers did,
    for every codec, raw payloads included (n = 2), negative zeros and tiny values too;
    and the error-feedback wrapper passes the divisor through."""
    for n, seed in ((2, 1), (9, 2), (4097, 3)):
        x = gaussian(n, seed=seed)
        x[: n // 3] *= 1e-38  # results near float32's subnormals
        x[n // 2] = -0.0
        c = codec(name)
        header, buffers = c.compress(x, key=11, round=4)
        expected = decompressed(c, header, buffers, n, 11, 4, dtype)
        expected /= divisor
        got = np.full(n, np.nan, dtype)
        c.decompress(header, buffers, got, key=11, round=4, divisor=divisor)
        np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))
        wrapped = ErrorFeedback(codec(name))
        again = np.full(n, np.nan, dtype)
        wrapped.decompress(header, buffers, again, key=11, round=4, divisor=divisor)
        np.testing.assert_array_equal(again.view(np.uint8), expected.view(np.uint8))
