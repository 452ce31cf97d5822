"""The blocks of each simulated launch run in an order of their own, not block 0 first.

Numba's CUDA simulator runs a grid's blocks one after another in index order, and starts a
block's threads in index order. A GPU runs blocks in any order, many at once. A kernel that
leans on the simulator's order passes every simulator case and is wrong on the card: the
last block of a pass to draw its ticket (kernels/cuda/topk_radix.py's ``last_block``, the
norms' pairing) taken to be the highest-numbered one, a value read before the block that
writes it has run, a float sum whose bits depend on which block adds first. ``shuffle()``
makes every launch take its blocks, and every block start its threads, in a shuffled order,
seeded so that a failure repeats (``GP_BLOCK_ORDER_SEED``, default 0).
"""
import os
import random
from pathlib import Path

import numpy as np
from numba.cuda.simulator import kernel


class _ShuffledIndex:
    """numpy, as the simulator's kernel module sees it, with ``ndindex`` shuffled: that
    module walks grid points and thread points with it and nothing else."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def ndindex(self, *shape):
        points = list(np.ndindex(*shape))
        self._random.shuffle(points)
        return iter(points)

    def __getattr__(self, name):
        return getattr(np, name)


def shuffle() -> None:
    """Before any kernel runs."""
    # a numba whose simulator stopped walking blocks with np.ndindex would keep index order
    # without a word: say so instead
    assert kernel.np is np and "np.ndindex(*grid_dim)" in Path(kernel.__file__).read_text(), \
        "numba's CUDA simulator changed: tests/support/block_order.py shuffles nothing"
    kernel.np = _ShuffledIndex(int(os.environ.get("GP_BLOCK_ORDER_SEED", "0")))
