"""The float16 average as it lands (kernels/cpu/fp16.divide_half): bit for bit numpy's
``np.divide`` of float16 by the number of workers, for every float16 value, through the
CPU's conversions and through the software ones."""
import numpy as np
import pytest

from gradpress.kernels.cpu import fp16
from gradpress.kernels.cpu.halfprec import HARDWARE_HALF

EVERY_HALF = np.arange(65536, dtype=np.uint16).view(np.float16)


@pytest.mark.parametrize("kernel", ["hardware", "software"])
@pytest.mark.parametrize("divisor", [1, 2, 3, 7, 8, 100, 1024, 2048])
def test_every_half_divided_as_numpy_divides_it(kernel, divisor):
    if kernel == "hardware" and not HARDWARE_HALF:
        pytest.skip("this CPU has no F16C")
    out = np.full_like(EVERY_HALF, 7.0)
    if kernel == "hardware":  # a multiply by the reciprocal in float64
        fp16._divide_hardware(EVERY_HALF.view(np.uint16), 1.0 / divisor, out.view(np.uint16))
    else:
        fp16._divide_software(EVERY_HALF.view(np.uint16), np.float32(divisor), out.view(np.uint16))
    with np.errstate(all="ignore"):
        want = np.divide(EVERY_HALF, divisor)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(out), nan), "NaN must stay NaN, and only NaN"
    differ = np.nonzero(out.view(np.uint16)[~nan] != want.view(np.uint16)[~nan])[0]
    assert differ.size == 0, f"{differ.size} values differ from numpy, first {EVERY_HALF[~nan][differ[:3]]}"


def test_the_reciprocal_in_float64_gives_float32_divisions_bits_for_every_half_and_divisor():
    """Every float16 value over every divisor up to 2048 (numpy's exact range): the hardware
    kernel's multiply by 1/d in float64 against the software kernel's float32 division,
    which the test above ties to numpy."""
    if not HARDWARE_HALF:
        pytest.skip("this CPU has no F16C")
    bits = EVERY_HALF.view(np.uint16)
    finite = ~np.isnan(EVERY_HALF)
    by_division, by_reciprocal = np.empty_like(bits), np.empty_like(bits)
    for divisor in range(1, 2049):
        fp16._divide_software(bits, np.float32(divisor), by_division)
        fp16._divide_hardware(bits, 1.0 / divisor, by_reciprocal)
        differ = np.nonzero(by_division[finite] != by_reciprocal[finite])[0]
        assert differ.size == 0, \
            f"divisor {divisor}: {differ.size} values differ, first {EVERY_HALF[finite][differ[:3]]}"


def test_the_landing_averages_float16_through_the_kernel(monkeypatch):
    """The worker's landing takes the kernel for float16 (not numpy's scalar loop)."""
    calls = []
    monkeypatch.setattr(fp16, "divide_half", lambda x, d, out: calls.append(d) or np.divide(x, d, out=out))
    from types import SimpleNamespace

    from gradpress.worker.stages import PartitionStages
    summed = np.full(8, 3.0, np.float16)
    dst = np.zeros(8, np.float16)
    op = SimpleNamespace(wkey=SimpleNamespace(key=1, count=8, via=None), round=0, sent_us=0.0, destination=dst,
                         job=SimpleNamespace(divisor=2, tensor=SimpleNamespace(layout=None, dtype="float16",
                                                                               compressor=None)))
    stages = SimpleNamespace(tracer=SimpleNamespace(add=lambda *a, **k: None), bytes_pulled=0, peer_chunks=None)
    PartitionStages.land(stages, op, {"dtype": "float16", "count": 8}, [SimpleNamespace(buffer=summed.tobytes())])
    assert calls == [2] and np.array_equal(dst, np.full(8, 1.5, np.float16))
