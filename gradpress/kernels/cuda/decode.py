"""Decoders on the GPU for the codecs whose pulled payload is indices and values (topk,
randomk) or packed codes (dithering): the payload goes to the device at its own size and
the dense result is written there, never built on the host and copied as n floats. The
payload is checked on the host first, as the host decoders check it, then goes over
through pinned staging (``uploads``) into reused scratch."""
import numpy as np
from numba import cuda

from gradpress.kernels.cuda.device import THREADS, blocks, stream
from gradpress.kernels.cuda.uploads import upload


@cuda.jit(cache=True)
def _zero(out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = 0.0


@cuda.jit(cache=True)
def _scatter(indices, values, divisor, out):
    """out[indices[j]] = values[j] / divisor, a float32 division (the host's ``divided``:
    the same bits; by 1 exact)."""
    j = cuda.grid(1)
    if j < indices.shape[0]:
        out[indices[j]] = values[j] / divisor


def scatter(indices: np.ndarray, values: np.ndarray, out, divisor: int = 1) -> None:
    """``out = 0; out[indices] = values / divisor`` (indices checked: increasing, below n).
    The values go over as they came (the division is the kernel's: no host array)."""
    where = upload(indices, "decode-indices") if indices.shape[0] else None
    scatter_drawn(where, values, out, divisor)


def scatter_drawn(indices, values: np.ndarray, out, divisor: int = 1) -> None:
    """``scatter`` where the indices are on the device already (random-k's, uploaded or
    drawn there; None for no index): only the values go over."""
    s = stream()
    _zero[blocks(out.shape[0]), THREADS, s](out)
    if indices is not None and indices.shape[0]:
        what = upload(np.asarray(values, np.float32), "decode-values")
        _scatter[blocks(indices.shape[0]), THREADS, s](indices, what, np.float32(divisor), out)


@cuda.jit(cache=True)
def _lookup(codes, table, width, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        per_byte = 8 // width
        code = (codes[i // per_byte] >> ((i % per_byte) * width)) & ((1 << width) - 1)
        out[i] = table[code]


def lookup(codes: np.ndarray, table: np.ndarray, width: int, out) -> None:
    """``out[i] = table[code i]`` for ``width``-bit codes packed least significant first
    (kernels/bitlayout.py), the codes checked against the table's levels beforehand."""
    s = stream()
    _lookup[blocks(out.shape[0]), THREADS, s](upload(codes, "decode-codes"),
                                              upload(np.asarray(table, np.float32), "decode-table"), width, out)
