"""The CPU dithering kernel's branch-free level (frexp/ldexp by the float64 bits) against
``quantize.level`` (the one the GPU and the numpy reference follow): the same level for
float32 magnitudes across the whole exponent range, subnormals, zero and the norm itself."""
import numpy as np
import pytest
from numba import njit

from gradpress.kernels.cpu.dithering import _level
from gradpress.kernels.quantize import level


@njit(cache=True)
def _both(magnitudes, norm, s, natural, draws, fast, slow):
    low_scale = 2.0 ** (s - 1)
    for i in range(magnitudes.shape[0]):
        m = np.float64(magnitudes[i])
        fast[i] = _level(m, np.float64(norm), s, natural, low_scale, draws[i])
        slow[i] = level(m, np.float64(norm), s, natural, draws[i])


@pytest.mark.parametrize("s", [1, 2, 3, 7, 15, 100, 127])
@pytest.mark.parametrize("natural", [True, False])
def test_branch_free_level_is_quantize_level(s, natural):
    rng = np.random.default_rng(s)
    bits = rng.integers(0, 0x7F800000, 200000, dtype=np.uint32)  # every finite magnitude
    magnitudes = np.concatenate([bits.view(np.float32), np.float32([0.0, 1e-45, 1.0])])
    for norm in (magnitudes.max(), np.float32(1.0), np.float32(3e38)):
        within = magnitudes[magnitudes <= norm]
        draws = np.concatenate([rng.integers(0, 1 << 24, within.size - 2) / float(1 << 24),
                                [0.0, (2 ** 24 - 1) / 2 ** 24]])
        fast, slow = np.empty(within.size, np.int64), np.empty(within.size, np.int64)
        _both(within, norm, s, natural, draws, fast, slow)
        np.testing.assert_array_equal(fast, slow)
