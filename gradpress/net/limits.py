"""How big anything a peer sends may be: one place for every size limit.

Everything follows from the partition size (``BYTEPS_PARTITION_BYTES``, the same on
every node: the launcher hands one environment to all of them). A key is one
partition, so no INIT_KEY may declare more elements than a partition holds, and no
data frame may be larger than a partition's bytes (a float32 residual of a float16
key is the largest: twice them). Headers are at most ``protocol.MAX_HEADER_BYTES``.
The scheduler only ever receives headers, so its sockets take much less than a
server's (and a data socket takes at least ROW_SHARE_FLOOR_BYTES). libzmq enforces
the frame limits (``ZMQ_MAXMSGSIZE``: a larger frame disconnects its sender before
any of it is stored); the roles check the rest when a message arrives, before they
allocate anything for it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .protocol import MAX_HEADER_BYTES

# The float32 residual of a float16 key is the widest frame a key's data can need.
_WIDEST_ITEMSIZE = 4
# A row-sparse tensor's share (server/sparse.py) is not cut into partitions: its frames may
# pass a partition's size, so data sockets take at least this much (broadcast_object's cap).
ROW_SHARE_FLOOR_BYTES = 64 << 20
# Messages a peer may leave unread in one socket's queue, each way (libzmq's default,
# set explicitly: what a stuck peer can cost is then known).
HIGH_WATER_MARK = 1000


@dataclass(frozen=True)
class Limits:
    partition_bytes: int

    def __post_init__(self) -> None:
        if self.partition_bytes < 1:
            raise ValueError(f"BYTEPS_PARTITION_BYTES={self.partition_bytes}: must be at least 1")

    def max_count(self, dtype: str) -> int:
        """The most elements one key (one partition) of ``dtype`` holds."""
        return max(1, self.partition_bytes // np.dtype(dtype).itemsize)

    @property
    def data_frame_bytes(self) -> int:
        """The largest frame a server or worker accepts (ZMQ_MAXMSGSIZE of their data sockets)."""
        widest = self.max_count("float16") * _WIDEST_ITEMSIZE
        return max(widest, MAX_HEADER_BYTES + 4096, ROW_SHARE_FLOOR_BYTES)

    @property
    def scheduler_frame_bytes(self) -> int:
        """The largest frame to or from the scheduler: a header and nothing more."""
        return MAX_HEADER_BYTES + 4096

    def check_count(self, count: int, dtype: str, what: str) -> None:
        """Raise ValueError if ``count`` elements of ``dtype`` do not fit in one key."""
        if count > self.max_count(dtype):
            raise ValueError(f"{what}: {count} {dtype} elements exceed one partition "
                             f"({self.max_count(dtype)} elements of BYTEPS_PARTITION_BYTES="
                             f"{self.partition_bytes}; every node must have the same setting)")


def check_lr(lr: float, what: str, error: type[ValueError] = ValueError) -> None:
    """A learning rate travels with pushes; it must be finite and not negative (else ``error``)."""
    if not (math.isfinite(lr) and lr >= 0):
        raise error(f"{what}: learning rate {lr!r} is not a finite number >= 0")
