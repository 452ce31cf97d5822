"""Numba CPU kernels. All are serial (``parallel=False``): servers call them from several
engine threads at once, which Numba's default workqueue threading layer does not survive.
They release the GIL (``nogil=True``) so engine threads still run in parallel.
"""
