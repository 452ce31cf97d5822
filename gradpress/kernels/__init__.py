"""Every Numba kernel of gradpress, below the codecs that call them.

Shared definitions live here (random numbers, reduction order, bit layout, quantisation
levels, scales); CPU kernels (``@njit``) in ``cpu/`` and numba.cuda kernels in ``cuda/``.
Nothing here imports a codec. ``cuda/`` is imported only when a compressor meets a device
array, so that CPU-only processes never import numba.cuda.
"""
