"""Freed memory kept for reuse by glibc's malloc (``GRADPRESS_KEEP_FREED_MEMORY``).

glibc serves a block of 32 MB or more with a fresh ``mmap`` whenever its heap has no free
block that large, and unmaps it when it is freed. A training step allocates the same large
blocks every time (a 4096x4096 layer's gradient is 64 MB, and so is the output of the
matrix product that computes it), so every step the kernel hands the process fresh pages
and zeroes each one on its first touch: 16,385 page faults per MLP step on a 2-core VM,
30% of its compute-only step (``docs/history/performance-2026.md``, "Page faults"). With blocks of up
to 256 MB served from the heap and the heap never trimmed, a freed block is reused by the
next step, as jemalloc and tcmalloc (which PyTorch's CPU tuning guides preload) do. The
cost: the process keeps its peak heap for its lifetime instead of giving freed blocks back.

Only glibc has ``mallopt``; elsewhere (musl, macOS) nothing changes.
"""
from __future__ import annotations

import ctypes
import logging

from .config import Settings

log = logging.getLogger(__name__)
M_TRIM_THRESHOLD = -1   # free space at the heap's top above this goes back to the kernel
M_MMAP_THRESHOLD = -3   # blocks of at least this many bytes get an mmap of their own
NEVER_TRIM = 2**31 - 1  # the largest value mallopt takes (an int)
# Blocks up to 256 MB (a 64M-element float32 gradient) come from the heap. Larger ones still
# get an mmap each: a heap that reuses blocks keeps what fragmentation costs it, and that
# cost grows with the blocks (a loop of random 1-128 MB tensors ended with 1.7x the RSS).
# glibc before 2.35 refuses a threshold above 32 MB; it then gets that.
THRESHOLDS = (256 << 20, 32 << 20)


def keep_freed_memory() -> bool:
    """Make this process's malloc serve blocks of up to ``THRESHOLDS[0]`` bytes from its heap
    and never give freed heap back. True when glibc took the settings; False where there is
    no glibc ``mallopt``."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # trimming first: with blocks from the heap but trimming on, a freed large block at the
    # top of the heap would go back to the kernel and the next step would fault it in again
    kept = mallopt(M_TRIM_THRESHOLD, NEVER_TRIM) == 1 and any(mallopt(M_MMAP_THRESHOLD, t) == 1 for t in THRESHOLDS)
    if not kept:
        log.info("gradpress: this C library refused mallopt; freed memory goes back to the kernel as usual")
    return kept


def configure(settings: Settings) -> None:
    """At a worker's or a server's start: keep freed memory unless the job says not to."""
    if settings.keep_freed_memory:
        keep_freed_memory()
