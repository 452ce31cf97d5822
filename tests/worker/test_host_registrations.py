"""Host memory a GPU worker registered with the CUDA driver (its shared push segments, the
servers' result slots) is given back at the job's end by the worker itself, on the device
that registered it, and only once gradpress's streams have ended their copies. There is no
GPU here: stand-ins take the driver's part, and say on which device, and when, each
registration was dropped."""
import contextlib
import os
import weakref

from gradpress.kernels.cuda import device, streams
from gradpress.net import shm
from gradpress.worker.stages import PartitionStages


class _Pinned:
    """numba's registration: unregistered by a finalizer when its last reference goes."""

    def __init__(self, log: list, current: list):
        weakref.finalize(self, lambda: log.append(current[-1] if current else None))


def _fake_devices(monkeypatch) -> list:
    current: list = []

    @contextlib.contextmanager
    def on_device(index):
        current.append(index)
        try:
            yield
        finally:
            current.pop()
    monkeypatch.setattr(device, "on_device", on_device)
    return current


def test_a_registration_is_dropped_on_the_device_that_made_it_once(monkeypatch):
    current, dropped = _fake_devices(monkeypatch), []
    registration = device.HostRegistration(_Pinned(dropped, current), 3)
    assert dropped == []
    registration.release()
    assert dropped == [3], "not unregistered under its own device's context"
    registration.release()
    assert dropped == [3]


class _HostCopies:
    def close(self, timeout_s: float) -> bool:
        return True


def _stages_holding(registrations: list, dropped: list, current: list) -> PartitionStages:
    stages = PartitionStages("w0", [], [], None, _HostCopies())
    arena = stages.device_arenas["cuda:1"] = shm.Arena("t", chunk_bytes=4096, pin=lambda chunk: registrations.pop())
    arena.alloc(4096)
    arena.alloc(4096)   # a second chunk
    peer = shm.Chunk.create("p", 4096)
    stages.peer_chunks._chunks[(os.getpid(), peer.fd, peer.inode)] = peer
    peer.pinned = device.HostRegistration(_Pinned(dropped, current), 1)
    refused = shm.Chunk.create("r", 4096)
    refused.pinned = False   # the driver refused it: nothing to give back
    stages.peer_chunks._chunks[(os.getpid(), refused.fd, refused.inode)] = refused
    return stages


def test_the_end_of_a_job_gives_every_registration_back_once_the_copies_ended(monkeypatch):
    current, dropped = _fake_devices(monkeypatch), []
    monkeypatch.setattr(streams, "drain", lambda timeout_s: True)
    stages = _stages_holding([device.HostRegistration(_Pinned(dropped, current), 1) for _ in range(2)],
                             dropped, current)
    stages.close()
    assert dropped == [1, 1, 1], "the two arena chunks and the peer chunk, each on device 1"


def test_copies_still_queued_at_the_deadline_keep_the_memory_registered(monkeypatch):
    current, dropped = _fake_devices(monkeypatch), []
    monkeypatch.setattr(streams, "drain", lambda timeout_s: False)
    held = [device.HostRegistration(_Pinned(dropped, current), 1) for _ in range(2)]
    stages = _stages_holding(list(held), dropped, current)
    stages.close()
    assert dropped == [], "unregistered under copies the device may still be making"


class _Refused:
    def release(self) -> None:
        raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")   # a sticky error fails every later call


def test_a_cuda_error_at_the_end_is_logged_and_the_rest_still_closes(monkeypatch, caplog):
    monkeypatch.setattr(streams, "drain", lambda timeout_s: True)
    stages = _stages_holding([_Refused(), _Refused()], [], [])
    closed = []
    monkeypatch.setattr(shm.Arena, "close", lambda arena: closed.append(arena))
    stages.close()
    assert len(closed) == 2, "the push arena and the device arena"
    assert "did not end cleanly" in caplog.text
