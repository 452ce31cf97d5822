"""Which server owns a row of a row-sparse tensor: one seeded hash, one modulus.

The owner of row ``i`` is ``below(draw_bits(stream, i), num_servers)``: the splitmix64
draw of the row index from a stream named by the seed (rng.py), mapped onto the servers
by a 32x32-bit product. Workers (to split a push), servers (to check one) and the GPU
path all call this one definition, so the insertion and the check can never use two
different moduli (Zen's published code did, and lost rows when the table size was not a
multiple of the server count). Integer arithmetic only: numpy, ``@njit`` and numba.cuda
give the same owner.
"""
import numpy as np
from numba import njit

from .rng import below, below_py, draw_bits, draw_bits_py, stream_id

# names the row-ownership stream apart from every codec stream of the same seed
_ROWS_KEY = 0x524F5753  # "ROWS"


def row_stream(seed: int) -> np.uint64:
    """The hash stream of ``seed`` (every node derives the same one)."""
    return stream_id(seed, _ROWS_KEY, 0)


def owner_py(stream, index, num_servers):
    """The server (``0 <= s < num_servers``) owning row ``index``; scalars or uint64 arrays."""
    return below_py(draw_bits_py(stream, index), num_servers)


@njit(inline="always", nogil=True, cache=True)
def owner(stream, index, num_servers):
    """``owner_py`` in compiled code (the same two steps, compiled)."""
    return below(draw_bits(stream, index), num_servers)


def owners(indices: np.ndarray, seed: int, num_servers: int) -> np.ndarray:
    """Owners of many rows (numpy; the kernels inline ``owner``)."""
    return owner_py(row_stream(seed), indices.astype(np.uint64), np.uint64(num_servers)).astype(np.int64)
