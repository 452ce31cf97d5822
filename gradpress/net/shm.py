"""Shared memory between workers and servers on the same host.

Over loopback TCP every byte is copied into the kernel and out again, and a
single server moves twice the bytes of a ring all-reduce. Co-located peers
instead share memory (as BytePS does): a worker writes a partition into a region
it owns and pushes only the header; the server sums straight from the mapping
and leaves results in regions of its own that workers read.

Memory comes in chunks, each a sealed ``memfd``, and a process hands out regions of
its chunks (a worker: one push area per key; a server: two result slots per key). A
region is named to a peer over the job's channel as ``[pid, fd, inode, offset]``;
the peer opens ``/proc/<pid>/fd/<fd>`` once per chunk, maps it and closes the
descriptor. Why:

- Descriptors: a few chunks per process, never one file per key, so ``ulimit -n``
  does not bound the number of tensors.
- Safety: a chunk is sealed against shrinking (and growing) before any peer hears
  of it, and seals can never be removed, so no process, its creator included, can
  cut pages from under a mapping (which would kill the reader with SIGBUS). A
  process maps only a chunk named by a member over the job's channel that is a
  gradpress memfd sealed against shrinking; fstat gives the size every region is
  checked against. Anything else is refused with an error.
- Leaks: a memfd has no name in /dev/shm; the kernel frees it when the last process
  that holds it (descriptor or mapping) exits, however it exits, kill -9 included.

The peers must see each other's /proc (the same host and PID namespace: what
``gradpress-launch`` gives a machine's processes).
"""
from __future__ import annotations

import fcntl
import mmap
import os
from typing import Any, Callable, NamedTuple

import numpy as np

# Sealed before a peer hears of the chunk; F_SEAL_SEAL: no seal can be added or removed after.
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
# A chunk is sparse: its pages cost memory only once written, so chunks can be generous.
CHUNK_BYTES = 64 << 20
# Regions start on a cache line, so two keys never write the same line.
ALIGN = 64
_MEMFD_PREFIX = "/memfd:gradpress-"


def available() -> bool:
    return hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


class Chunk:
    """One sealed memfd, mapped: our own (``create``) or a peer's (``attach``)."""

    def __init__(self, fd: int, nbytes: int, own: bool):
        self.nbytes = nbytes
        self.inode = os.fstat(fd).st_ino
        self.map = mmap.mmap(fd, nbytes)
        self.pinned: Any = None  # a registration with the CUDA driver (Arena's ``pin``), kept while mapped
        # ours stays open for as long as peers may open it through /proc; a peer's is closed
        self.fd = fd if own else -1

    @classmethod
    def create(cls, tag: str, nbytes: int) -> "Chunk":
        fd = os.memfd_create(f"gradpress-{tag}{os.getpid()}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, nbytes)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
            return cls(fd, nbytes, own=True)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, pid: int, fd: int, inode: int) -> "Chunk":
        """Map a peer's chunk.

        Raises:
            OSError: it cannot be opened (gone, another PID namespace, no permission).
            ValueError: it is not a sealed gradpress chunk, or not the one named.
        """
        path = f"/proc/{pid}/fd/{fd}"
        target = os.readlink(path)
        if not target.startswith(_MEMFD_PREFIX):  # never open a device, pipe or file by mistake
            raise ValueError(f"{path} is {target[:64]!r}, not a gradpress shared-memory chunk")
        own = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
        try:
            st = os.fstat(own)
            if st.st_ino != inode:
                raise ValueError(f"{path} is inode {st.st_ino}, not the chunk {inode} that was named")
            if not fcntl.fcntl(own, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK:
                raise ValueError(f"{path} is not sealed against shrinking (a file that shrinks under a "
                                 f"mapping kills its reader)")
            if st.st_size <= 0:
                raise ValueError(f"{path} is empty")
            return cls(own, st.st_size, own=False)
        finally:
            os.close(own)

    def close(self) -> None:
        """Stop peers from opening it; mappings (ours, theirs) live on until unmapped."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Region(NamedTuple):
    """``nbytes`` bytes at ``offset`` in ``chunk``."""
    chunk: Chunk
    offset: int
    nbytes: int

    def array(self, dtype: str, count: int, offset: int = 0) -> np.ndarray:
        return np.frombuffer(self.chunk.map, dtype=dtype, count=count, offset=self.offset + offset)

    @property
    def ref(self) -> list[int]:
        """How a peer finds it (our own regions only): ``[pid, fd, inode, offset]``."""
        return [os.getpid(), self.chunk.fd, self.chunk.inode, self.offset]


def _aligned(nbytes: int) -> int:
    """What a region of ``nbytes`` takes of its chunk: whole cache lines, at least one."""
    return -(-max(nbytes, 1) // ALIGN) * ALIGN


class Arena:
    """Regions of our own chunks, a new chunk when the last is full.

    A key keeps its region until it is released (``free``): the region's whole pages go
    back to the system at once (a hole punched in the memfd; peers that still map it read
    zeros, never a fault, as the file keeps its size), and the region is handed out again
    to the next request of the same size (a re-plan declares groups of the sizes it
    released). The chunks themselves go when the process does.

    ``pin``, when given, registers each new chunk for DMA (a GPU worker's copies go straight
    from the device into it). A registered chunk's pages are never punched: the driver holds
    the pages it pinned, and a punched hole would give the file new ones the copies never reach.
    ``punch=False`` keeps every page for the same reason where peers may register our chunks.
    """

    def __init__(self, tag: str, chunk_bytes: int = CHUNK_BYTES, pin: Callable[[Chunk], Any] | None = None,
                 punch: bool = True):
        self.tag, self.chunk_bytes, self.pin = tag, chunk_bytes, pin
        # False: released pages stay (a peer may have registered our chunk for DMA, and a
        # punched hole would give the file pages its copies never reach); regions are still reused
        self.punch = punch
        self.chunks: list[Chunk] = []
        self._used = 0
        self._free: dict[int, list[Region]] = {}  # aligned size -> released regions of that size

    def alloc(self, nbytes: int) -> Region:
        size = _aligned(nbytes)
        if self._free.get(size):
            chunk, offset, _ = self._free[size].pop()
            return Region(chunk, offset, nbytes)
        if not self.chunks or self._used + size > self.chunks[-1].nbytes:
            self.chunks.append(Chunk.create(self.tag, max(self.chunk_bytes, size)))
            self._used = 0
            if self.pin is not None:
                self.chunks[-1].pinned = self.pin(self.chunks[-1])
        region = Region(self.chunks[-1], self._used, nbytes)
        self._used += size
        return region

    def free(self, region: Region) -> None:
        """Release ``region`` (one of ours, no longer read or written by anyone): its pages
        are returned now, and it is kept for reuse."""
        size = _aligned(region.nbytes)
        # only the pages wholly inside it: its neighbours may share the first and last
        first = -(-region.offset // mmap.PAGESIZE) * mmap.PAGESIZE
        end = (region.offset + size) // mmap.PAGESIZE * mmap.PAGESIZE
        if end > first and region.chunk.pinned is None and self.punch:
            try:
                region.chunk.map.madvise(mmap.MADV_REMOVE, first, end - first)
            except OSError:  # a kernel that cannot punch it: the pages stay, the region is still reused
                pass
        self._free.setdefault(size, []).append(region)

    def close(self) -> None:
        for chunk in self.chunks:
            chunk.close()


class PeerChunks:
    """Peers' chunks as this process mapped them, each opened once."""

    def __init__(self) -> None:
        self._chunks: dict[tuple[int, int, int], Chunk] = {}

    def region(self, ref: object, nbytes: int) -> Region:
        """The ``nbytes`` bytes that a peer's ``ref`` names.

        Raises:
            OSError, ValueError: as :meth:`Chunk.attach`, or the region is not inside its chunk.
        """
        if not (isinstance(ref, list) and len(ref) == 4
                and all(type(v) is int and v >= 0 for v in ref)):
            raise ValueError(f"a shared-memory reference is [pid, fd, inode, offset], not {str(ref)[:64]}")
        pid, fd, inode, offset = ref
        chunk = self._chunks.get((pid, fd, inode))
        if chunk is None:
            chunk = self._chunks[(pid, fd, inode)] = Chunk.attach(pid, fd, inode)
        if offset + nbytes > chunk.nbytes:
            raise ValueError(f"bytes {offset}..{offset + nbytes} lie past the end of a {chunk.nbytes}-byte chunk")
        return Region(chunk, offset, nbytes)

    def mapped(self) -> list[Chunk]:
        """Every peer chunk this process has mapped."""
        return list(self._chunks.values())
