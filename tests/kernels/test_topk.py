"""gradpress/kernels/cpu/topk.py: the sampled-threshold selection equals the full selection
(same elements, same ties), also when the estimate is off and the fallback runs."""
import numpy as np
import pytest

from gradpress.kernels.cpu import topk
from gradpress.kernels.selection import sample_plan
from tests.compressors.cases import gaussian


def full(x: np.ndarray, k: int) -> tuple:
    indices, values = np.empty(k, np.uint32), np.empty(k, np.float32)
    topk.select_topk(x, indices, values)
    return indices, values


def inputs(n: int):
    yield "gaussian", gaussian(n, seed=n)
    yield "ties", np.round(gaussian(n, seed=n + 1) * 2).astype(np.float32)
    yield "zeros", np.zeros(n, np.float32)
    sorted_up = np.sort(np.abs(gaussian(n, seed=n + 2)))  # the strided sample sees a ramp
    yield "ramp", sorted_up
    spikes = np.zeros(n, np.float32)
    spikes[::997] = 1.0  # fewer non-zeros than some k: zeros must tie-break by index
    yield "spikes", spikes


def numpy_rule(x: np.ndarray, k: int) -> np.ndarray:
    """Indices kept by the rule, from numpy: k largest |x|, ties to the lowest index."""
    order = np.lexsort((np.arange(x.shape[0]), -np.abs(x.astype(np.float64))))
    return np.sort(order[:k]).astype(np.uint32)


@pytest.mark.parametrize("n", [1, 2, 9, 300, 4096, 4097, 50000, 200003])
@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.3, 1.0])
def test_sampled_selection_equals_the_full_one(n, fraction):
    k = min(n, max(1, int(np.ceil(fraction * n))))
    for label, x in inputs(n):
        indices, values = np.empty(k, np.uint32), np.empty(k, np.float32)
        assert topk.topk(x, indices, values), label
        want_indices, want_values = full(x, k)
        np.testing.assert_array_equal(indices, want_indices, err_msg=label)
        np.testing.assert_array_equal(values.view(np.uint32), want_values.view(np.uint32),
                                      err_msg=label)
        if n <= 50000:
            np.testing.assert_array_equal(indices, numpy_rule(x, k), err_msg=label)


# the k-th largest |p| of the case below has key 0x40387832; the 500th largest, 0x4048C20A
@pytest.mark.parametrize("estimate, label", [(0x7F000000, "too high: no candidate"),
                                             (0x4048C20A, "too high: k / 2 candidates"),
                                             (0, "too low: over capacity")])
def test_a_wrong_estimate_falls_back_to_the_full_selection(estimate, label):
    """The scan zeroes the candidates it stores; the fallback must give them their p back."""
    n, k = 100000, 1000
    g, e = gaussian(n, seed=1), gaussian(n, seed=2)
    p = (g + np.float32(0.5) * e).astype(np.float32)
    out = np.empty(n, np.float32)
    indices, values = np.empty(k, np.uint32), np.empty(k, np.float32)
    _, _, capacity = sample_plan(n, k)
    finite, held = topk.topk_feedback_with(g, e, 0.5, out, indices, values, estimate, capacity)
    assert finite and not held, label
    want_indices, want_values = full(p, k)
    np.testing.assert_array_equal(indices, want_indices)
    np.testing.assert_array_equal(values, want_values)
    p[want_indices] = 0.0
    assert out.tobytes() == p.tobytes()


def test_a_good_estimate_holds():
    n, k = 100000, 1000
    x = gaussian(n, seed=4)
    out = np.empty(n, np.float32)
    indices, values = np.empty(k, np.uint32), np.empty(k, np.float32)
    estimate, capacity = topk._estimate(x, x, 0.0, k)
    finite, held = topk.topk_feedback_with(x, x, 0.0, out, indices, values, estimate, capacity)
    assert finite and held
    np.testing.assert_array_equal(indices, full(x, k)[0])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_input_is_reported(bad):
    x = gaussian(9000, seed=5)
    x[8999] = bad
    indices, values = np.empty(90, np.uint32), np.empty(90, np.float32)
    assert not topk.topk(x, indices, values)
    assert not topk.topk_feedback(x, x, 0.0, np.empty_like(x), indices, values)
