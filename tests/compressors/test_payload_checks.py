"""Malformed payloads raise ValueError and leave the output untouched."""
import numpy as np
import pytest

from tests.compressors.cases import CODEC_IDS, codec, gaussian

N = 1000


def payload(name):
    c = codec(name)
    header, buffers = c.compress(gaussian(N, seed=3), key=2, round=1)
    return c, header, [np.array(b, copy=True) for b in buffers]


def assert_rejected(c, header, buffers, match):
    out = np.full(N, 7.0, np.float32)
    with pytest.raises(ValueError, match=match):
        c.decompress(header, buffers, out, key=2, round=1)
    with pytest.raises(ValueError, match=match):
        c.decompress_add(header, buffers, out, key=2, round=1)
    assert np.all(out == 7.0), "a rejected payload must not write"


@pytest.mark.parametrize("name", CODEC_IDS)
def test_truncated_buffer(name):
    c, header, buffers = payload(name)
    buffers[-1] = buffers[-1].view(np.uint8)[:-1]
    assert_rejected(c, header, buffers, "bytes, expected")


@pytest.mark.parametrize("name", CODEC_IDS)
def test_missing_or_extra_buffer(name):
    c, header, buffers = payload(name)
    assert_rejected(c, header, buffers[:-1], "buffers")
    assert_rejected(c, header, buffers + [np.zeros(4, np.uint8)], "buffers")


@pytest.mark.parametrize("name", CODEC_IDS)
def test_wrong_codec_or_length(name):
    c, header, buffers = payload(name)
    assert_rejected(c, {**header, "codec": "other"}, buffers, "codec")
    assert_rejected(c, {**header, "n": N + 1}, buffers, "elements")
    out = np.zeros(N, np.int32)
    with pytest.raises(ValueError, match="float16/float32/float64"):
        c.decompress(header, buffers, out, key=2, round=1)


@pytest.mark.parametrize("name, field, value", [
    ("topk-frac", "k", N + 5), ("topk-frac", "k", -1), ("topk-frac", "k", "ten"),
    ("randomk", "k", 0), ("randomk", "seed", -3), ("randomk", "scaled", "yes"),
    ("dither-linear-max", "s", 0), ("dither-linear-max", "s", 400),
    ("dither-linear-max", "partition", "cubic"), ("none", "raw", "int8"),
])
def test_bad_header_fields(name, field, value):
    c, header, buffers = payload(name)
    assert_rejected(c, {**header, field: value}, buffers, field if field != "raw" else "dtype")


def test_topk_indices_out_of_range_or_repeated():
    c, header, buffers = payload("topk-frac")
    buffers[0][-1] = N
    assert_rejected(c, header, buffers, "indices")
    c, header, buffers = payload("topk-frac")
    buffers[0][1] = buffers[0][0]
    assert_rejected(c, header, buffers, "indices")


@pytest.mark.parametrize("name", ["topk-frac", "randomk"])
def test_non_finite_values(name):
    c, header, buffers = payload(name)
    buffers[-1][3] = np.inf
    assert_rejected(c, header, buffers, "NaN or inf")


@pytest.mark.parametrize("name", ["onebit-l1", "dither-linear-max"])
def test_bad_scale(name):
    c, header, buffers = payload(name)
    buffers[0][0] = np.nan
    assert_rejected(c, header, buffers, "finite")
    buffers[0][0] = -1.0
    assert_rejected(c, header, buffers, "finite")


def test_dithering_codes_beyond_s_or_padding_bits():
    c, header, buffers = payload("dither-natural-max")  # s = 3, 4-bit codes
    buffers[1][0] = 0x07  # level 7 > 3
    assert_rejected(c, header, buffers, "levels")
    c = codec("dither-natural-max")
    header, buffers = c.compress(gaussian(N - 1, seed=3), key=2, round=1)
    buffers = [np.array(b, copy=True) for b in buffers]
    buffers[1][-1] |= 0x10  # the unused upper half of the last byte
    out = np.zeros(N - 1, np.float32)
    with pytest.raises(ValueError, match="padding"):
        c.decompress(header, buffers, out, key=2, round=1)


def test_buffers_may_be_bytes_and_memoryviews():
    c, header, buffers = payload("onebit-l1")
    out_bytes, out_view = np.zeros(N, np.float32), np.zeros(N, np.float32)
    c.decompress(header, [b.tobytes() for b in buffers], out_bytes, key=2, round=1)
    c.decompress(header, [memoryview(b) for b in buffers], out_view, key=2, round=1)
    np.testing.assert_array_equal(out_bytes, out_view)
    assert np.all(np.abs(out_bytes) > 0)
