"""How fixed-width codes are packed into bytes (onebit: 1 bit, dithering: 2/4/8 bits).

Element ``i`` goes to byte ``i // (8 // width)`` at bit offset ``(i % (8 // width)) *
width``, least significant bits first; unused bits of the last byte are zero.
"""


def packed_nbytes(n: int, width: int) -> int:
    """Bytes holding ``n`` codes of ``width`` bits."""
    per_byte = 8 // width
    return (n + per_byte - 1) // per_byte
