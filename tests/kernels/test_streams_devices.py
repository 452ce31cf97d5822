"""``streams.working_on`` on a thread that owns the worker's GPU work (it keeps numba's
device and its torch stream set between calls): a block on one GPU nested in another GPU's
block leaves that other GPU's device and stream current again when it ends. Stand-ins take
numba's and torch's parts (this host has no GPU); they record what was selected."""
import threading
import types

from gradpress.kernels.cuda import streams


class _TorchStream:
    def __init__(self, device: int):
        self.device, self.cuda_stream = device, 1000 + device


def _fakes(monkeypatch) -> types.SimpleNamespace:
    state = types.SimpleNamespace(numba_device=None, torch_stream=None)

    def select_device(index):
        state.numba_device = index

    def set_stream(s):
        state.torch_stream = s
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(Stream=lambda device: _TorchStream(device),
                                                             set_stream=set_stream))
    monkeypatch.setattr(streams, "_torch", lambda: torch)
    monkeypatch.setattr(streams, "cuda", types.SimpleNamespace(select_device=select_device,
                                                               external_stream=lambda handle: ("numba", handle)))
    monkeypatch.setattr(streams, "_pairs", {})
    return state


def _on(index: int):
    return types.SimpleNamespace(device=types.SimpleNamespace(type="cuda", index=index))


def test_a_block_on_another_gpu_nested_in_an_owning_thread_gives_the_outer_gpu_back(monkeypatch):
    state, seen, errors = _fakes(monkeypatch), [], []

    def owner():
        try:
            with streams.working_on(_on(0)):
                outer = (state.numba_device, state.torch_stream.device, streams.stream())
                with streams.working_on(_on(1), landing=True):
                    seen.append((state.numba_device, state.torch_stream.device, streams.stream()))
                seen.append((state.numba_device, state.torch_stream.device, streams.stream()))
            seen.insert(0, outer)
        except Exception as e:  # noqa: BLE001 - reported on the test's thread
            errors.append(e)
    thread = threading.Thread(target=owner)
    thread.owns_gpu_work = True
    thread.start()
    thread.join(10)
    assert not errors, errors
    (d0, t0, s0), (d1, t1, s1), (back, t_back, s_back) = seen
    assert (d0, t0, d1, t1) == (0, 0, 1, 1) and s0 != s1
    assert (back, t_back, s_back) == (0, 0, s0), "the outer block went on with the inner GPU's device or stream"
