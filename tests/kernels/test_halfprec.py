"""The CPU's own fp16 conversions (F16C, used by fp16's fused error feedback) against the
software ones and numpy: the same bits for every non-NaN input. (The full 2**32 float32
patterns were checked once by hand; here: every pattern's top 19 bits with the low 13
bits at each rounding edge, plus random patterns, every half when widening.)"""
import numpy as np
import pytest
from numba import njit

from gradpress.kernels.cpu import fp16
from gradpress.kernels.cpu.halfprec import (
    HARDWARE_HALF, float_bits_to_half_bits, half_bits_to_float, hardware_from_half,
    hardware_to_half)

pytestmark = pytest.mark.skipif(not HARDWARE_HALF, reason="this CPU has no F16C")


@njit(cache=True)
def _narrow_both(float_bits, hardware, software):
    for i in range(float_bits.shape[0]):
        hardware[i] = hardware_to_half(float_bits[i:i + 1].view(np.float32)[0])
        software[i] = float_bits_to_half_bits(float_bits[i])


@njit(cache=True)
def _widen_both(half_bits, hardware, software):
    for i in range(half_bits.shape[0]):
        hardware[i] = hardware_from_half(half_bits[i])
        software[i] = half_bits_to_float(half_bits[i])


def edge_patterns() -> np.ndarray:
    # the 13 bits that fp16 drops decide the rounding: below, at and above the half-way
    # point, and the extremes, under every sign/exponent/top-10-mantissa prefix
    high = np.arange(1 << 19, dtype=np.uint32) << np.uint32(13)
    lows = np.array([0, 1, 0x0FFF, 0x1000, 0x1001, 0x1FFF], np.uint32)
    random = np.random.default_rng(0).integers(0, 1 << 32, 1 << 21, dtype=np.uint32)
    return np.concatenate([(high[:, None] | lows[None, :]).ravel(), random])


def test_hardware_narrowing_matches_software_and_numpy_except_nan_payloads():
    bits = edge_patterns()
    hardware, software = np.empty(bits.shape, np.uint16), np.empty(bits.shape, np.uint16)
    _narrow_both(bits, hardware, software)
    values = bits.view(np.float32)
    keep = ~np.isnan(values)
    np.testing.assert_array_equal(hardware[keep], software[keep])
    with np.errstate(over="ignore"):
        want = values[keep].astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(hardware[keep], want)
    # a NaN stays a NaN (its payload may differ from the software's 0x7E00)
    assert np.all((hardware[~keep] & 0x7C00) == 0x7C00) and np.all(hardware[~keep] & 0x03FF)


def test_hardware_widening_matches_software_for_every_half():
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    hardware, software = np.empty(halves.shape, np.float32), np.empty(halves.shape, np.float32)
    _widen_both(halves, hardware, software)
    keep = ~np.isnan(software)
    want = halves.view(np.float16).astype(np.float32)
    for got in (hardware, want):
        np.testing.assert_array_equal(got[keep].view(np.uint32), software[keep].view(np.uint32))
    np.testing.assert_array_equal(np.isnan(hardware), ~keep)


@pytest.mark.parametrize("lam", [1.0, 0.7])
def test_fp16_fused_feedback_gives_the_same_bytes_with_either_conversion(lam):
    # the software kernel is what a CPU without F16C runs: it must agree with the one
    # the fused tests check against the generic steps on this machine
    rng = np.random.default_rng(1)
    g = (rng.standard_normal(10007) * 10.0 ** rng.integers(-9, 5, 10007)).astype(np.float32)
    e = rng.standard_normal(10007).astype(np.float32)
    outputs = []
    for kernel in (fp16._feedback_hardware, fp16._feedback_software):
        bits, e_out = np.empty(g.shape, np.uint16), np.empty_like(g)
        finite = kernel(g[:-1], e[:-1], lam, bits[:-1], e_out[:-1])
        outputs.append((finite, bits[:-1].tobytes(), e_out[:-1].tobytes()))
        outputs.append(kernel(np.array([7e4], np.float32), e[:1], lam, bits[:1], e_out[:1]))
    assert outputs[0] == outputs[2] and outputs[0][0]
    assert outputs[1] is outputs[3] is False  # beyond fp16's range: refused by both
