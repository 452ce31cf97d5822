"""Numba CPU kernels shared by servers and compressors."""
