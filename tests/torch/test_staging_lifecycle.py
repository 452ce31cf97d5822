"""``HostStaging``'s pinned buffers and events over many calls, with stand-ins for CUDA
tensors, streams and events (no GPU here): buffers follow the declared names, the host
waits on blocking events, an event goes back to its own GPU's pool, and a name whose wait
ran out, or whose copy failed, is not left busy for good."""
import collections
from types import SimpleNamespace

import pytest
import torch

from gradpress.errors import OpTimeoutError
from gradpress.kernels.cuda import streams
from gradpress.torch import handles, staging
from gradpress.worker.future import Future


class Event:
    """Remembers the GPU it was first recorded on, and refuses another (as CUDA's do)."""

    def __init__(self, blocking: bool):
        self.blocking, self.device = blocking, None

    def record(self, stream) -> None:
        self.device = stream.device if self.device is None else self.device
        if stream.device != self.device:
            raise RuntimeError(f"Event device {self.device} does not match recording stream's device {stream.device}")


class Stream:
    def __init__(self, device: int):
        self.device, self.waited = device, []

    def wait_event(self, event) -> None:
        self.waited.append(event)


class CudaTensor:
    """What ``stage`` asks of a CUDA tensor."""
    is_cuda = True

    def __init__(self, n: int, index: int, dtype=torch.bfloat16, fail_copy=False):
        self.t, self.dtype, self.shape = torch.ones(n, dtype=dtype), dtype, (n,)
        self.device = torch.device("cuda", index)
        self.fail_copy = fail_copy

    def detach(self):
        return self

    def reshape(self, *shape):
        if self.fail_copy:
            return SimpleNamespace(dtype=torch.float32, numel=lambda: self.t.numel(), to=None)
        return self.t.reshape(*shape)


class Pools(collections.defaultdict):
    made: list


@pytest.fixture
def cuda(monkeypatch):
    pools = Pools(collections.deque)
    monkeypatch.setattr(streams, "_events", pools)

    def event(index, blocking=False):
        if pools[index, blocking]:
            return pools[index, blocking].popleft()
        made.append(Event(blocking))
        return made[-1]
    made = pools.made = []
    monkeypatch.setattr(streams, "event", event)
    current = {}
    fake_torch = SimpleNamespace(
        empty=lambda n, dtype, pin_memory=False: torch.empty(n, dtype=dtype),
        cuda=SimpleNamespace(current_stream=lambda device: current.setdefault(device.index, Stream(device.index))))
    monkeypatch.setattr(staging, "torch", fake_torch)
    return pools


def test_the_copy_the_host_waits_for_is_a_blocking_event_and_goes_back_to_its_pool(cuda):
    s = staging.HostStaging()
    buffer, copied = s.stage("w", CudaTensor(8, 0), torch.float32)
    assert copied.blocking, "the host-copies thread would spin a core on it"
    s.done("w", buffer, torch.device("cuda", 0))
    assert copied in cuda[0, True]


def test_buffers_of_names_no_longer_declared_are_dropped(cuda):
    declared = set()
    s = staging.HostStaging(lambda name: name in declared)
    for version in range(20):   # an auto plan's groups, one set a plan, the old ones released
        name = f"Plan{version}.0.w"
        declared = {name}
        buffer, _ = s.stage(name, CudaTensor(1024, 0), torch.float32)
        s.done(name, buffer, torch.device("cuda", 0))
    assert list(s._buffers) == ["Plan19.0.w"] and list(s._read) == ["Plan19.0.w"]
    # the dropped names' read events went back to the pool, and the next name's came from it
    assert sum(not e.blocking for e in cuda.made) == 1


def test_unnamed_push_pulls_keep_no_buffer(cuda):
    s = staging.HostStaging()
    for i in range(5):
        name = f"{staging.NONAME}{i}"
        buffer, _ = s.stage(name, CudaTensor(16, 0), torch.float32)
        s.done(name, buffer, torch.device("cuda", 0))
    assert s._buffers == {} and s._busy == set()


def test_a_name_used_on_another_gpu_returns_the_event_to_its_own_gpus_pool(cuda):
    s = staging.HostStaging()
    buffer, _ = s.stage("m", CudaTensor(4, 0), torch.float32)
    s.done("m", buffer, torch.device("cuda", 0))
    buffer, _ = s.stage("m", CudaTensor(4, 1), torch.float32)   # raised: device 0's event recorded on 1
    s.done("m", buffer, torch.device("cuda", 1))
    for (index, _), pool in cuda.items():
        assert all(e.device in (None, index) for e in pool), f"an event of another GPU in GPU {index}'s pool"


def test_a_copy_that_fails_leaves_the_name_free(cuda):
    s = staging.HostStaging()
    with pytest.raises(Exception):
        s.stage("w", CudaTensor(4, 0, fail_copy=True), torch.float32)
    assert "w" not in s._busy and "w" not in s._buffers


def test_a_name_whose_wait_ran_out_is_freed_once_its_push_pull_is_over(cuda):
    s = staging.HostStaging()
    buffer, _ = s.stage("w", CudaTensor(4, 0), torch.float32)
    future = Future("push_pull of tensor 'w'")
    handle = handles.register(handles.Pending(future, torch.empty(4), lambda: s.done("w", buffer, None),
                                              lambda: s.failed("w", buffer)))
    with pytest.raises(OpTimeoutError):
        handles.wait(handle, 0.01)
    assert "w" in s._busy   # it may still write into the buffer
    future.set(None)        # ... and then ends
    handles.before_start()  # the next start undoes it
    assert "w" not in s._busy
    again, _ = s.stage("w", CudaTensor(4, 0), torch.float32)
    assert again is s._buffers["w"], "the name did not get a buffer of its own again"
