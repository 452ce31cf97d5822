"""Where an uncompressed partition's pulled sum lies, and how it lands in the job's output.

The sum comes in a frame or, from a server on the same host, lies in the server's shared
result slot and is read in place. It lands divided by the job's divisor: on the host in
one pass (float16 in Numba: numpy's half divide is a scalar loop), or into a CUDA output by
a copy to the device at the sum's own size, on the landing stream, and a divide there. A
slot that the server keeps for DMA is registered with the CUDA driver first, once.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..compressors.arrays import is_device_array
from ..kernels.cpu import fp16
from ..net import shm


def result_of(h: dict, frames: list, n: int, dtype: str, peer_chunks: shm.PeerChunks) -> np.ndarray:
    """The ``n`` summed ``dtype`` values a PULL_REPLY carries or points at.

    Raises:
        ValueError: a slot other than 0 or 1, or frames of another size.
    """
    if "shm" in h:
        nbytes = n * np.dtype(dtype).itemsize
        if h.get("slot") not in (0, 1):
            raise ValueError(f"result slot {h.get('slot')!r} is not 0 or 1")
        return peer_chunks.region(h["shm"], 2 * nbytes).array(dtype, n, offset=h["slot"] * nbytes)
    if len(frames) != 1 or len(frames[0].buffer) != n * np.dtype(dtype).itemsize:
        raise ValueError(f"expected one frame of {n} {dtype} elements")
    return np.frombuffer(frames[0].buffer, dtype=dtype)


def land(summed: np.ndarray, dst: Any, divisor: int, h: dict, peer_chunks: shm.PeerChunks) -> None:
    """``dst[:] = summed / divisor`` (a true division, float32 arithmetic for float16)."""
    if is_device_array(dst):
        from ..kernels.cuda import device
        with device.working_on(dst, landing=True):
            if h.get("dma") and "shm" in h:
                _register_slots(peer_chunks, h["shm"])
            # no host wait, on the landing stream: a frame is pageable (staged before the
            # call returns), and a slot is rewritten only after our next push of the key,
            # which the host sends after the consumer's stream has waited for this copy
            device.land_divided(summed, dst, divisor, wait=False)
    elif divisor != 1 and summed.dtype == np.float16 and dst.flags.c_contiguous:
        fp16.divide_half(summed, divisor, dst)
    elif divisor != 1:
        np.divide(summed, divisor, out=dst)  # average while copying: one pass
    else:
        np.copyto(dst, summed)


def _register_slots(peer_chunks: shm.PeerChunks, ref: list) -> None:
    """Register the server's chunk holding a key's result slots with the CUDA driver, once
    (it said its pages are never punched): each round's copy to the device is then DMA at
    the bus's speed, not staged through the driver's bounce buffers (51% of an
    uncompressed step's communication thread on an H100)."""
    chunk = peer_chunks.region(ref, 0).chunk
    if chunk.pinned is None:
        from ..kernels.cuda import device
        chunk.pinned = device.pin_host(chunk.map, chunk.nbytes) or False  # False: refused, never retried
