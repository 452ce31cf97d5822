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


def test_to_half_is_numpys_rounding():
    x = np.random.default_rng(1).standard_normal(100_000).astype(np.float32) * 1000
    x[:4] = [np.inf, -np.inf, 70000, 1e-8]  # overflow to inf and underflow to 0 on purpose
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    assert np.array_equal(kernels.to_half(x).view(np.uint16), want.view(np.uint16))

