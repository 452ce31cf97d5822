"""The dithering CPU kernels that read packed codes, against the rules read code by code
in plain Python, for every code width and lengths that leave the last byte full or
partial: the payload check (``codes_within``: every level at most s, the last byte's
padding zero; valid payloads and random bytes) and the decoder (written and added)."""
import numpy as np
import pytest

from gradpress.compressors.dithering import code_width
from gradpress.kernels.cpu.dithering import codes_within, decode


def within_by_hand(codes: np.ndarray, s: int, width: int, n: int) -> bool:
    per_byte = 8 // width
    for b, byte in enumerate(codes.tolist()):
        for j in range(per_byte):
            code = (byte >> (j * width)) & ((1 << width) - 1)
            if b * per_byte + j >= n:
                if code:
                    return False
            elif code & ((1 << (width - 1)) - 1) > s:
                return False
    return True


def packed(levels: list[int], width: int) -> np.ndarray:
    per_byte = 8 // width
    codes = np.zeros(-(-len(levels) // per_byte), np.uint8)
    for i, code in enumerate(levels):
        codes[i // per_byte] |= np.uint8(code << ((i % per_byte) * width))
    return codes


@pytest.mark.parametrize("s", [1, 3, 7, 15, 127])
def test_the_check_agrees_with_the_rule_code_by_code(s):
    width = code_width(s)
    rng = np.random.default_rng(s)
    sign = 1 << (width - 1)
    seen = {True: 0, False: 0}
    for n in list(range(0, 40)) + [4093, 4096, 4099]:
        levels = [int(v) | (sign if neg else 0)
                  for v, neg in zip(rng.integers(0, s + 1, n), rng.integers(0, 2, n))]
        cases = [packed(levels, width), rng.integers(0, 256, -(-n * width // 8), dtype=np.uint8)]
        if n:
            over = list(levels)
            over[int(rng.integers(0, n))] = min(s + 1, sign - 1)  # one level above s, where one fits
            cases.append(packed(over, width))
            padded = packed(levels, width)
            if n % (8 // width):
                padded[-1] |= np.uint8(1 << ((n % (8 // width)) * width))  # a padding bit set
            cases.append(padded)
        for codes in cases:
            want = within_by_hand(codes, s, width, n)
            assert codes_within(codes, s, width, n) == want, (s, n, codes[-4:])
            seen[want] += 1
    # every payload is valid only where no level can exceed s and no byte has padding
    assert seen[True] and (seen[False] or (s + 1 >= sign and width == 8))


@pytest.mark.parametrize("width", [2, 4, 8])
def test_the_decoder_reads_code_i_from_its_bits_in_byte_i_over_per_byte(width):
    rng = np.random.default_rng(width)
    per_byte = 8 // width
    for n in list(range(0, 30)) + [1001, 4096, 4097]:
        codes = rng.integers(0, 256, -(-n * width // 8), dtype=np.uint8)
        table = rng.standard_normal(1 << width).astype(np.float32)
        want = np.array([table[(int(codes[i // per_byte]) >> ((i % per_byte) * width)) & ((1 << width) - 1)]
                         for i in range(n)], np.float32)
        out = np.empty(n, np.float32)
        decode(codes, table, width, out, False)
        assert out.tobytes() == want.tobytes(), n
        acc = np.ones(n, np.float32)
        decode(codes, table, width, acc, True)
        assert acc.tobytes() == (np.float32(1) + want).tobytes(), n
