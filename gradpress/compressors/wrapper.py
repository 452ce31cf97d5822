"""Base of the stateful wrappers (error feedback, momentum): decoding is the inner codec's.

Only compression carries state; what travels is the inner codec's payload, so
decoding, and the payload's size, pass straight through.
"""
from typing import Any, Sequence

from gradpress.compressors.base import Header


class Wrapper:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name

    def decompress(self, header: Header, buffers: Sequence[Any], out: Any, key: int,
                   round: int, divisor: int = 1) -> None:
        self.inner.decompress(header, buffers, out, key, round, divisor)

    def decompress_add(self, header: Header, buffers: Sequence[Any], acc: Any, key: int,
                       round: int) -> None:
        self.inner.decompress_add(header, buffers, acc, key, round)

    def restart(self, key: int) -> None:
        """``key``'s round was skipped on every worker (a NaN average): its state starts again."""
        self.inner.restart(key)

    def nbytes(self, header: Header, buffers: Sequence[Any]) -> int:
        return self.inner.nbytes(header, buffers)
