"""Unbiased codecs: the Monte-Carlo mean of D(C(x)) over rounds approaches x."""
import numpy as np
import pytest

from tests.compressors.cases import UNBIASED, codec, decompressed, gaussian


@pytest.mark.parametrize("name", UNBIASED)
def test_monte_carlo_mean_is_within_a_few_sigma(name):
    n, rounds = 64, 1500
    x = gaussian(n, seed=11)
    c = codec(name)
    samples = np.empty((rounds, n))
    for t in range(rounds):
        samples[t] = decompressed(c, *c.compress(x, key=5, round=t), n, 5, t)
    mean = samples.mean(axis=0)
    sigma = samples.std(axis=0) / np.sqrt(rounds)
    # exact entries have sigma 0: allow float32 rounding there
    z = np.abs(mean - x) / np.maximum(sigma, 1e-6 * (1 + np.abs(x)))
    assert z.max() < 5.0, f"largest deviation {z.max():.1f} sigma at {z.argmax()}"


def test_randomk_without_scaling_is_biased_towards_zero():
    n, rounds = 64, 400
    x = np.ones(n, np.float32)
    c = codec("randomk")
    mean = np.mean([decompressed(c, *c.compress(x, key=5, round=t), n, 5, t)
                    for t in range(rounds)], axis=0)
    assert abs(mean.mean() - 0.25) < 0.02
