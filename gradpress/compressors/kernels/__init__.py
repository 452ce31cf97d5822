"""Compression kernels: shared definitions (random numbers, reduction order, bit layout),
Numba CPU kernels in ``cpu/`` and numba.cuda kernels in ``cuda/``.

``cuda/`` is imported only when a compressor meets a device array, so that CPU-only
processes never import numba.cuda.
"""
