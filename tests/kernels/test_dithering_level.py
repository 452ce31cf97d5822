"""The CPU dithering kernel's branch-free level (frexp/ldexp by the float64 bits) against
``quantize.level`` (the one the GPU and the numpy reference follow): the same level for
float32 magnitudes across the whole exponent range, subnormals, zero and the norm itself,
and where a magnitude sits exactly on a rounding boundary or one float32 step either side."""
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


def _on_boundaries(s: int, rng) -> tuple:
    """Magnitudes that are exactly (u + 1) * norm * 2**k (the natural levels' rounding
    boundary above 2**(1 - s)), u * norm * 2**(1 - s) (below it) or (low + u) * norm / s
    (linear), with their neighbours, for norms and draws of few mantissa bits so that the
    products are float32 numbers; returns (magnitudes, norms, draws)."""
    magnitudes, norms, draws = [], [], []
    for _ in range(3000):
        norm = np.float32(rng.integers(1, 64) * 2.0 ** rng.integers(-140, 100))
        u = rng.integers(0, 1 << 6) * 2.0 ** -6
        candidates = [(u + 1.0) * float(norm) * 2.0 ** int(rng.integers(1 - s, 1)),
                      u * float(norm) * 2.0 ** (1 - s),
                      (rng.integers(0, s) + u) * float(norm) / s]
        for exact in candidates:
            m = np.float32(exact)
            if float(m) != exact or not 0 < m <= norm:
                continue
            for near in (np.nextafter(m, np.float32(0)), m, np.nextafter(m, np.float32(np.inf))):
                if near <= norm:
                    magnitudes.append(near), norms.append(norm), draws.append(u)
    return np.array(magnitudes, np.float32), np.array(norms, np.float32), np.array(draws)


@njit(cache=True)
def _both_per_norm(magnitudes, norms, s, natural, draws, fast, slow):
    low_scale = 2.0 ** (s - 1)
    for i in range(magnitudes.shape[0]):
        m, norm = np.float64(magnitudes[i]), np.float64(norms[i])
        fast[i] = _level(m, norm, s, natural, low_scale, draws[i])
        slow[i] = level(m, norm, s, natural, draws[i])


@pytest.mark.parametrize("s", [1, 2, 3, 7, 15, 127])
@pytest.mark.parametrize("natural", [True, False])
def test_levels_agree_on_the_rounding_boundaries(s, natural):
    magnitudes, norms, draws = _on_boundaries(s, np.random.default_rng(s))
    assert magnitudes.size > 1000
    fast, slow = np.empty(magnitudes.size, np.int64), np.empty(magnitudes.size, np.int64)
    _both_per_norm(magnitudes, norms, s, natural, draws, fast, slow)
    np.testing.assert_array_equal(fast, slow)
    # the boundaries are reached: a magnitude on one rounds down where the next one up rounds up
    assert (np.diff(slow) > 0).any()
