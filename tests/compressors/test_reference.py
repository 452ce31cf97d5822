"""Numba kernels against the numpy reference: payloads bit-exact, decoding bit-exact."""
import numpy as np
import pytest

from gradpress.compressors import build_compressor, reference
from gradpress.compressors.dithering import code_width
from gradpress.kernels.cpu import norms
from tests.compressors.cases import decompressed, gaussian

LENGTHS = [2, 7, 9, 64, 1000, 4096, 4097, 3 * 4096 + 17]
KEY, ROUND = 1234, 56


def inputs(n: int):
    yield "gaussian", gaussian(n, seed=n)
    yield "wide", (gaussian(n, seed=n + 1) * np.float32(10.0) ** gaussian(n, seed=n + 2) * 3
                   ).astype(np.float32)
    ties = np.round(gaussian(n, seed=n + 3)).astype(np.float32)
    yield "ties", ties


def assert_payload_equal(buffers, expected, what):
    assert len(buffers) == len(expected), what
    for got, want in zip(buffers, expected):
        assert got.dtype == want.dtype, what
        np.testing.assert_array_equal(got, want, err_msg=what)


@pytest.mark.parametrize("n", LENGTHS)
def test_norm_kernels_match_the_reference_order_bit_for_bit(n):
    for label, x in inputs(n):
        magnitude = np.abs(x.astype(np.float64))
        assert norms.abs_sum(x) == reference.ordered_sum(magnitude), label
        assert norms.square_sum(x) == reference.ordered_sum(magnitude * magnitude), label
        assert norms.max_abs_bits(x) == np.abs(x).max().view(np.uint32), label


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("scaling", ["none", "l1", "l2"])
def test_onebit(n, scaling):
    c = build_compressor({"compressor": "onebit", "scaling": scaling if scaling != "none"
                          else False}, "server")
    for label, x in inputs(n):
        header, buffers = c.compress(x, key=KEY, round=ROUND)
        expected = reference.onebit(x, scaling)
        assert_payload_equal(buffers, expected, f"onebit {label} n={n}")
        np.testing.assert_array_equal(decompressed(c, header, buffers, n),
                                      reference.onebit_decode(expected, n))


@pytest.mark.parametrize("n", LENGTHS)
def test_topk(n):
    c = build_compressor({"compressor": "topk", "k": 0.1}, "server")
    for label, x in inputs(n):
        header, buffers = c.compress(x, key=KEY, round=ROUND)
        if "raw" in header:
            continue
        expected = reference.topk(x, header["k"])
        assert_payload_equal(buffers, expected, f"topk {label} n={n}")
        np.testing.assert_array_equal(decompressed(c, header, buffers, n),
                                      reference.pairs_decode(*expected, n))


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("scaling", [False, True])
def test_randomk(n, scaling):
    c = build_compressor({"compressor": "randomk", "k": 0.3, "seed": 99, "scaling": scaling},
                         "server")
    for label, x in inputs(n):
        header, buffers = c.compress(x, key=KEY, round=ROUND)
        if "raw" in header:
            continue
        expected = reference.randomk(x, header["k"], 99, KEY, ROUND, scaling)
        assert_payload_equal(buffers, expected, f"randomk {label} n={n}")
        indices = reference.random_indices(n, header["k"], 99, KEY, ROUND)
        np.testing.assert_array_equal(decompressed(c, header, buffers, n, KEY, ROUND),
                                      reference.pairs_decode(indices, expected[0], n))


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("s, partition, normalize", [
    (1, "linear", "max"), (3, "natural", "l2"), (7, "linear", "l2"), (7, "natural", "max"),
    (100, "linear", "max"), (127, "natural", "l2")])
def test_dithering(n, s, partition, normalize):
    c = build_compressor({"compressor": "dithering", "s": s, "partition": partition,
                          "normalize": normalize, "seed": 5}, "server")
    natural, width = partition == "natural", code_width(s)
    for label, x in inputs(n):
        header, buffers = c.compress(x, key=KEY, round=ROUND)
        if "raw" in header:
            continue
        expected = reference.dithering(x, s, natural, normalize, width, 5, KEY, ROUND)
        assert_payload_equal(buffers, expected, f"dithering {label} n={n}")
        np.testing.assert_array_equal(
            decompressed(c, header, buffers, n),
            reference.dithering_decode(expected, s, natural, width, n))


@pytest.mark.parametrize("n", LENGTHS)
def test_fp16(n):
    c = build_compressor({"compressor": "fp16"}, "server")
    for label, x in inputs(n):
        header, buffers = c.compress(x, key=KEY, round=ROUND)
        expected = reference.fp16(x)
        assert_payload_equal(buffers, expected, f"fp16 {label} n={n}")
        np.testing.assert_array_equal(decompressed(c, header, buffers, n),
                                      reference.fp16_decode(expected))


def test_float16_and_float64_inputs_compress_as_their_float32_values():
    x16 = gaussian(1000, dtype=np.float16)
    c = build_compressor({"compressor": "onebit", "scaling": True}, "server")
    assert_payload_equal(c.compress(x16, key=0, round=0)[1],
                         reference.onebit(x16.astype(np.float32), "l1"), "float16 input")
    x64 = gaussian(1000, dtype=np.float64) / 3
    c = build_compressor({"compressor": "topk", "k": 0.05}, "server")
    assert_payload_equal(c.compress(x64, key=0, round=0)[1],
                         reference.topk(x64.astype(np.float32), 50), "float64 input")
