"""Shared-memory segments for a worker and a server on the same host.

Over loopback TCP every byte is copied into the kernel and out again, and a
single server moves twice the bytes of a ring all-reduce. Co-located peers
instead share memory (as BytePS does): a worker writes a partition into a segment
it owns and pushes only the header; the server sums straight from the mapping
and leaves results in a segment of its own that workers read.

Segments are files in /dev/shm named with the creator's pid. A server unlinks a
worker's segment as soon as it has mapped it (the mappings live on), and a
starting process removes segments whose creator is dead, so a kill -9 leaks
nothing for long.
"""
from __future__ import annotations

import mmap
import os
import re
import uuid

import numpy as np

SHM_DIR = "/dev/shm"
_NAME = re.compile(r"^gradpress-[ws](\d+)-[0-9a-f]+-\d+$")


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


class Segment:
    """A shared mapping of ``nbytes`` bytes, created or attached by name."""

    def __init__(self, name: str, nbytes: int, create: bool):
        if not _NAME.match(name):
            raise ValueError(f"not a gradpress shared-memory segment name: {name!r}")
        self.name, self.nbytes = name, nbytes
        self.path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, max(nbytes, 1))
            elif os.fstat(fd).st_size < nbytes:
                raise ValueError(f"shared-memory segment {name} holds {os.fstat(fd).st_size} bytes, "
                                 f"expected {nbytes}")
            self._map = mmap.mmap(fd, max(nbytes, 1))
        finally:
            os.close(fd)

    @classmethod
    def create(cls, kind: str, key: int, nbytes: int) -> "Segment":
        """A new segment; ``kind`` is ``"w"`` (a worker's push) or ``"s"`` (a server's results)."""
        return cls(f"gradpress-{kind}{os.getpid()}-{uuid.uuid4().hex[:8]}-{key}", nbytes, create=True)

    def array(self, dtype: str, count: int, offset: int = 0) -> np.ndarray:
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=offset)

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def sweep_stale() -> int:
    """Remove segments whose creating process no longer exists; returns how many."""
    if not available():
        return 0
    removed = 0
    for name in os.listdir(SHM_DIR):
        m = _NAME.match(name)
        if m and not _alive(int(m.group(1))):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed += 1
            except OSError:
                pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
