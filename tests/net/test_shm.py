"""Shared memory: sealed memfd chunks, regions of them, and what a process refuses to map."""
import fcntl
import os

import numpy as np
import pytest

from gradpress.net import protocol
from gradpress.net.protocol import Op
from gradpress.net.shm import ALIGN, Arena, Chunk, PeerChunks
from gradpress.server.engine import Engine
from gradpress.trace import Tracer


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_ten_thousand_regions_take_a_few_descriptors_and_never_overlap():
    before = _open_fds()
    arena = Arena("w", chunk_bytes=1 << 20)
    peers = PeerChunks()
    try:
        regions = [arena.alloc(100 + i % 7) for i in range(10_000)]
        views = [peers.region(r.ref, r.nbytes).array("uint8", r.nbytes) for r in regions[::97]]
        assert len(arena.chunks) == 2, f"{len(arena.chunks)} chunks for 10,000 regions of about 128 bytes"
        assert _open_fds() - before <= 2 * len(arena.chunks) + len(arena.chunks), \
            "descriptors grew with the number of regions"
        starts = [(id(r.chunk), r.offset) for r in regions]
        assert len(set(starts)) == len(starts) and all(r.offset % ALIGN == 0 for r in regions)
        for r, view in zip(regions[::97], views):  # a peer's mapping sees what the owner wrote
            r.array("uint8", r.nbytes)[:] = r.offset % 251
            assert np.all(view == r.offset % 251)
        big = arena.alloc(3 << 20)  # larger than a chunk: a chunk of its own
        assert big.chunk.nbytes >= 3 << 20 and big.offset == 0
    finally:
        arena.close()
    assert _open_fds() - before <= len(peers._chunks) + 3, "closing the arena left its descriptors open"


def test_nobody_can_shrink_or_grow_a_chunk_not_even_its_creator():
    chunk = Chunk.create("s", 1 << 16)
    try:
        other = os.open(f"/proc/self/fd/{chunk.fd}", os.O_RDWR)  # as another local process would
        try:
            for fd in (chunk.fd, other):
                for size in (0, 4096, 1 << 20):
                    with pytest.raises(PermissionError):
                        os.ftruncate(fd, size)
            with pytest.raises(PermissionError):
                fcntl.fcntl(other, fcntl.F_ADD_SEALS, 0)  # seals are final
        finally:
            os.close(other)
        assert os.fstat(chunk.fd).st_size == 1 << 16
    finally:
        chunk.close()


def _memfd(name: str, size: int, seals: int = 0) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def test_a_peer_maps_only_sealed_gradpress_chunks_and_regions_inside_them(tmp_path):
    peers, pid = PeerChunks(), os.getpid()
    plain = tmp_path / "plain"
    plain.write_bytes(b"\0" * 4096)
    fds = {"unsealed": _memfd("gradpress-w1", 4096),
           "shrinkable": _memfd("gradpress-w2", 4096, fcntl.F_SEAL_GROW),
           "foreign": _memfd("someone-else", 4096, fcntl.F_SEAL_SHRINK),
           "file": os.open(plain, os.O_RDWR)}
    good = Chunk.create("w", 4096)
    try:
        for why, fd in fds.items():
            with pytest.raises(ValueError, match="not sealed against shrinking|not a gradpress"):
                peers.region([pid, fd, os.fstat(fd).st_ino, 0], 64)
        with pytest.raises(ValueError, match="not the chunk"):
            peers.region([pid, good.fd, good.inode + 1, 0], 64)
        with pytest.raises(ValueError, match="past the end"):
            peers.region([pid, good.fd, good.inode, 4096 - 63], 64)
        for bad in ("name", [pid, good.fd, good.inode], [pid, good.fd, good.inode, -1], [pid, True, 1, 0]):
            with pytest.raises(ValueError, match="pid, fd, inode, offset"):
                peers.region(bad, 64)
        with pytest.raises(OSError):
            peers.region([pid, 999_999, good.inode, 0], 64)  # no such descriptor
        assert peers.region([pid, good.fd, good.inode, 4096 - 64], 64).nbytes == 64
    finally:
        good.close()
        for fd in fds.values():
            os.close(fd)


def _header(op, sender, **fields):
    return protocol.decode(protocol.encode(op, sender, **fields))


def test_a_server_refuses_a_file_it_could_be_killed_by_and_keeps_summing():
    """Issue 14: a member names a file of its own in INIT_KEY and shrinks it afterwards.

    The engine refuses the file with an ERROR to its sender (it is not a sealed chunk), so
    shrinking it touches nothing the server maps; the real workers' sums stay right.
    """
    engine = Engine(0, None, "", "", "server 0", num_workers=2, async_mode=False, tracer=Tracer(""))
    path = "/dev/shm/gradpress-attack-%d" % os.getpid()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    arena = Arena("w", chunk_bytes=4096)
    try:
        os.ftruncate(fd, 4096)
        init = dict(key=3, name="t", count=8, dtype="float32")
        attack = _header(Op.INIT_KEY, "worker 1", **init, shm=[os.getpid(), fd, os.fstat(fd).st_ino, 0])
        [err] = engine._handle(b"B", attack, [])
        assert err.op == Op.ERROR and "not a gradpress shared-memory chunk" in err.fields["message"], err
        os.ftruncate(fd, 0)  # the attack: this would have been a SIGBUS in the server's next sum
        mine = arena.alloc(32)
        assert engine._handle(b"A", _header(Op.INIT_KEY, "worker 0", **init, shm=mine.ref), []) == []
        mine.array("float32", 8)[:] = 2
        engine._handle(b"A", _header(Op.PUSH, "worker 0", key=3, round=0, dtype="float32", count=8, shm=True), [])
        engine._handle(b"B", _header(Op.PUSH, "worker 1", key=3, round=0, dtype="float32", count=8),
                       [np.full(8, 5, np.float32).tobytes()])
        [reply] = engine._handle(b"A", _header(Op.PULL, "worker 0", key=3, round=0), [])
        pid, rfd, inode, offset = reply.fields["shm"]
        assert pid == os.getpid() and reply.fields["slot"] == 0
        got = PeerChunks().region(reply.fields["shm"], 64).array("float32", 8)
        assert np.all(got == 7), got
    finally:
        os.close(fd)
        os.unlink(path)
        arena.close()
        engine.results.close()


def _resident_bytes(chunk: Chunk) -> int:
    return os.fstat(chunk.fd).st_blocks * 512


def test_a_freed_region_returns_its_whole_pages_and_is_reused_for_the_same_size():
    page = 4096
    arena = Arena("w", chunk_bytes=1 << 20)
    try:
        before, key, after = arena.alloc(100), arena.alloc(5 * page + 100), arena.alloc(100)
        for r, value in ((before, 1), (key, 2), (after, 3)):
            r.array("uint8", r.nbytes)[:] = value
        peer = PeerChunks().region(key.ref, key.nbytes).array("uint8", key.nbytes)  # a reader's mapping
        resident = _resident_bytes(key.chunk)
        arena.free(key)
        # the 4 pages wholly inside it went back (its first and last are shared with neighbours)
        assert resident - _resident_bytes(key.chunk) == 4 * page
        assert np.all(before.array("uint8", 100) == 1) and np.all(after.array("uint8", 100) == 3)
        first_whole = -(-key.offset // page) * page - key.offset
        assert np.all(peer[first_whole:first_whole + 4 * page] == 0), "a peer's mapping reads zeros, no fault"
        again = arena.alloc(5 * page + 90)  # the same aligned size: the same place
        assert (again.chunk, again.offset) == (key.chunk, key.offset)
        other = arena.alloc(5 * page + 100)  # nothing of that size is free now: a new region
        assert other.offset > after.offset
        arena.free(before)
        arena.free(after)  # two of one size: each handed out once
        assert {arena.alloc(100).offset, arena.alloc(100).offset} == {before.offset, after.offset}
        assert arena.alloc(100).offset > other.offset
    finally:
        arena.close()


def test_a_released_keys_result_slots_are_freed_and_reused_by_the_next_key():
    engine = Engine(0, None, "", "", "server 0", num_workers=1, async_mode=False, tracer=Tracer(""))
    arena = Arena("w")
    try:
        count = 3000  # 12,000 bytes: two slots span whole pages
        def declare(key):
            push = arena.alloc(4 * count)
            assert engine._handle(b"A", _header(Op.INIT_KEY, "worker 0", key=key, name=f"t{key}", count=count,
                                                dtype="float32", shm=push.ref), []) == []
            return push
        push = declare(1)
        push.array("float32", count)[:] = 4
        engine._handle(b"A", _header(Op.PUSH, "worker 0", key=1, round=0, dtype="float32", count=count, shm=True), [])
        [reply] = engine._handle(b"A", _header(Op.PULL, "worker 0", key=1, round=0), [])
        slots = engine.keys[1].sink.region
        resident = sum(_resident_bytes(c) for c in engine.results.chunks)
        engine._handle(b"A", _header(Op.RELEASE, "worker 0", key=1), [])
        assert 1 not in engine.keys
        assert sum(_resident_bytes(c) for c in engine.results.chunks) < resident, "the slots' pages stayed"
        declare(2)
        assert (engine.keys[2].sink.region.chunk, engine.keys[2].sink.region.offset) == (slots.chunk, slots.offset)
        assert len(engine.results.chunks) == 1
    finally:
        arena.close()
        engine.results.close()


def test_a_gpu_workers_result_slots_say_dma_and_keep_their_pages_when_released():
    """A GPU worker registers the slots it reads with the CUDA driver: the server must never
    punch them (the driver keeps the old pages; the file would get new ones)."""
    engine = Engine(0, None, "", "", "server 0", num_workers=1, async_mode=False, tracer=Tracer(""))
    arena = Arena("w")
    try:
        count = 3000
        push = arena.alloc(4 * count)
        assert engine._handle(b"A", _header(Op.INIT_KEY, "worker 0", key=1, name="t1", count=count,
                                            dtype="float32", shm=push.ref, dma=True), []) == []
        push.array("float32", count)[:] = 4
        engine._handle(b"A", _header(Op.PUSH, "worker 0", key=1, round=0, dtype="float32", count=count, shm=True), [])
        [reply] = engine._handle(b"A", _header(Op.PULL, "worker 0", key=1, round=0), [])
        assert reply.fields["dma"] is True
        slots = engine.keys[1].sink.region
        assert slots.chunk in engine.dma_results.chunks and not engine.results.chunks
        resident = _resident_bytes(slots.chunk)
        engine._handle(b"A", _header(Op.RELEASE, "worker 0", key=1), [])
        assert _resident_bytes(slots.chunk) == resident, "a slot a GPU worker may have registered lost its pages"
        assert np.all(slots.array("float32", count) == 4)
    finally:
        arena.close()
        engine.results.close()
        engine.dma_results.close()
