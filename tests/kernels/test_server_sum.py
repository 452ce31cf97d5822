"""The server's Numba sum kernels against numpy."""
import numpy as np
import pytest

from gradpress.kernels.cpu import server_sum as kernels


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_accumulate_matches_numpy(dtype):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(1001) * 100).astype(dtype), (rng.standard_normal(1001)).astype(dtype)
    acc = np.empty(1001, np.float64 if dtype == np.float64 else np.float32)
    kernels.accumulate(acc, a, first=True)
    kernels.accumulate(acc, b, first=False)
    want = a.astype(acc.dtype) + b.astype(acc.dtype)
    assert np.array_equal(acc, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_pair_sum_has_the_bits_of_a_copy_then_an_add(dtype):
    rng = np.random.default_rng(2)
    a, b = (rng.standard_normal(4097) * 1e3).astype(dtype), rng.standard_normal(4097).astype(dtype)
    a[:3], b[:3] = [np.inf, np.nan, 1e30], [-np.inf, 1.0, 1e30]
    acc, out = np.empty_like(a), np.empty_like(a)
    kernels.accumulate(acc, a, first=True)
    kernels.accumulate(acc, b, first=False)
    kernels.sum_pair(out, a, b)
    assert out.tobytes() == acc.tobytes()


def test_a_pair_sum_refuses_mixed_or_narrow_dtypes():
    x32, x16 = np.ones(4, np.float32), np.ones(4, np.float16)
    with pytest.raises(TypeError, match="float32 or float64 arrays of one dtype, not float32, float16"):
        kernels.sum_pair(np.empty(4, np.float32), x16, x32)
    with pytest.raises(TypeError, match="not float16"):
        kernels.sum_pair(np.empty(4, np.float16), x16, x16)


def test_to_half_is_numpys_rounding():
    x = np.random.default_rng(1).standard_normal(100_000).astype(np.float32) * 1000
    x[:4] = [np.inf, -np.inf, 70000, 1e-8]  # overflow to inf and underflow to 0 on purpose
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    assert np.array_equal(kernels.to_half(x).view(np.uint16), want.view(np.uint16))



def test_float16_sums_give_numpys_bits_for_every_finite_half_and_keep_nan():
    """The sums' float16 steps (the CPU's own conversions where it has them) against numpy
    over every one of the 65,536 half patterns: widened exactly, added in float32, rounded
    once; a NaN stays a NaN (its payload may differ from numpy's)."""
    from gradpress.kernels.cpu import fp16
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    halves = every.view(np.float16)
    finite = np.isfinite(halves)
    acc = np.empty(every.size, np.float32)
    fp16.sum_half_bits(every, acc, first=True)
    want = halves.astype(np.float32)
    assert np.array_equal(acc[finite].view(np.uint32), want[finite].view(np.uint32))
    assert np.array_equal(np.isnan(acc), np.isnan(want)) and np.array_equal(acc[np.isinf(want)], want[np.isinf(want)])
    fp16.sum_half_bits(every[::-1].copy(), acc, first=False)
    with np.errstate(invalid="ignore", over="ignore"):
        want = want + halves[::-1].astype(np.float32)
        rounded = want.astype(np.float16)
    assert np.array_equal(acc.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
    out = kernels.to_half(acc)
    keep = ~np.isnan(rounded)
    assert np.array_equal(out.view(np.uint16)[keep], rounded.view(np.uint16)[keep])
    assert np.isnan(out[~keep]).all() and (~keep).sum() > 0
    # subnormal and overflowing sums, rounded at the boundaries (ties to even)
    edges = np.array([6.1e-5, 5.96e-8, 2.98e-8, 65504.0, 65519.9, 65520.0, -65520.0, 1e-10], np.float32)
    with np.errstate(over="ignore"):
        assert np.array_equal(kernels.to_half(edges).view(np.uint16), edges.astype(np.float16).view(np.uint16))
