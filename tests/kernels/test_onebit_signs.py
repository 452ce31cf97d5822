"""``onebit.unpack_signs`` on both sides of the table it writes through from
``TABLE_FROM`` bytes on: every value against numpy's select, signed zeros included."""
import numpy as np
import pytest

from gradpress.kernels.cpu import onebit

EDGE = 8 * onebit.TABLE_FROM


@pytest.mark.parametrize("n", [0, 1, 9, EDGE - 9, EDGE - 1, EDGE, EDGE + 1, EDGE + 7, 3 * EDGE + 13])
@pytest.mark.parametrize("scale", [0.0, 0.375, 1.5e-40, 3.0e38])
def test_written_and_added_values_are_numpys_select(n, scale):
    rng = np.random.default_rng(n)
    bits = rng.integers(0, 256, (n + 7) // 8, dtype=np.uint8)
    if n % 8:  # the padding bits of the last byte set: they must not reach anything
        bits[-1] |= np.uint8(0xFF << (n % 8) & 0xFF)
    negative = np.unpackbits(bits, bitorder="little")[:n].astype(bool)
    scale = np.float32(scale)
    want = np.where(negative, -scale, scale).astype(np.float32)

    written = np.full(n + 1, np.nan, np.float32)  # one more: nothing is written past n
    onebit.unpack_signs(bits, scale, written[:n], False)
    np.testing.assert_array_equal(written[:n].view(np.uint32), want.view(np.uint32))
    assert np.isnan(written[n])

    base = rng.standard_normal(n).astype(np.float32)
    added = base.copy()
    onebit.unpack_signs(bits, scale, added, True)
    np.testing.assert_array_equal(added.view(np.uint32), (base + want).view(np.uint32))
