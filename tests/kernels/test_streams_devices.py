"""``streams.working_on`` across GPUs. On a thread that owns the worker's GPU work (it keeps
numba's device and its torch stream set between calls), a block on one GPU nested in another
GPU's block leaves that other GPU's device and stream current again when it ends; on any other
thread, a block on one GPU never makes a context on another. Stand-ins take numba's and
torch's parts (this host has no GPU); they record what was selected."""
import contextlib
import threading
import types

import numpy as np
import torch

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
    monkeypatch.setattr(streams, "_pop_context", lambda: None)  # select_device above replaces, not pushes
    monkeypatch.setattr(streams, "_pairs", {})
    return state


def _on(index: int):
    return types.SimpleNamespace(device=types.SimpleNamespace(type="cuda", index=index))


def _on_owning_thread(work) -> None:
    """Run ``work`` on a thread that owns the worker's GPU work (as the communication thread
    does); its exception is raised here."""
    errors = []

    def run():
        try:
            work()
        except Exception as e:  # noqa: BLE001 - reported on the test's thread
            errors.append(e)
    thread = threading.Thread(target=run)
    thread.owns_gpu_work = True
    thread.start()
    thread.join(10)
    assert not errors, errors


def test_a_block_on_another_gpu_nested_in_an_owning_thread_gives_the_outer_gpu_back(monkeypatch):
    state, seen = _fakes(monkeypatch), []

    def owner():
        with streams.working_on(_on(0)):
            outer = (state.numba_device, state.torch_stream.device, streams.stream())
            with streams.working_on(_on(1), landing=True):
                seen.append((state.numba_device, state.torch_stream.device, streams.stream()))
            seen.append((state.numba_device, state.torch_stream.device, streams.stream()))
        seen.insert(0, outer)
    _on_owning_thread(owner)
    (d0, t0, s0), (d1, t1, s1), (back, t_back, s_back) = seen
    assert (d0, t0, d1, t1) == (0, 0, 1, 1) and s0 != s1
    assert (back, t_back, s_back) == (0, 0, s0), "the outer block went on with the inner GPU's device or stream"


class _Runtime:
    """A model of one host thread's CUDA state, as the driver, the runtime and torch keep it:
    a stack of contexts (numba pushes and pops a GPU's; selecting a device replaces the top),
    torch's idea of the current device (where it sets a device without a context yet, it
    only notes it), and torch's current stream per device. Its ``stream`` block leaves as
    torch's ``StreamContext`` does: each device's stream set back, the current device's last."""

    def __init__(self, believed: int):
        self.stack, self.contexts, self.believed, self.current = [], set(), believed, {}

    def select(self, index: int) -> None:  # cudaSetDevice: the top of the stack becomes the GPU's
        if self.stack:
            self.stack[-1] = index
        else:
            self.stack.append(index)
        self.contexts.add(index)
        self.believed = index

    def maybe_select(self, index: int) -> None:  # torch's MaybeSetDevice
        if index in self.contexts:
            self.select(index)
        else:
            self.believed = index

    def current_stream(self, device=None) -> _TorchStream:
        index = self.believed if device is None else device
        return self.current.get(index) or _TorchStream(index)

    def set_stream(self, s: _TorchStream) -> None:
        if self.believed != s.device:
            self.select(s.device)
        self.current[s.device] = s

    class _Gpu:
        def __init__(self, rt, index):
            self.rt, self.index = rt, index

        def __enter__(self):
            self.rt.stack.append(self.index)
            self.rt.contexts.add(self.index)

        def __exit__(self, *_):
            popped = self.rt.stack.pop()
            assert popped == self.index, f"numba popped GPU {popped}'s context from under its push of GPU {self.index}"

    def device(self, index: int):
        rt = self

        class _Device:
            def __enter__(self):
                self.before = rt.believed
                rt.select(index)

            def __exit__(self, *_):
                rt.maybe_select(self.before)
        return _Device()

    def stream(self, s: _TorchStream):
        rt = self

        class _Context:
            def __enter__(self):
                self.src = rt.current_stream()
                if self.src.device != s.device:
                    with rt.device(s.device):
                        self.dst = rt.current_stream(s.device)
                rt.set_stream(s)

            def __exit__(self, *_):
                if self.src.device != s.device:
                    rt.set_stream(self.dst)
                rt.set_stream(self.src)
        return _Context()


def test_a_thread_torch_believes_on_gpu_0_works_on_gpu_1_without_touching_gpu_0(monkeypatch):
    # a training thread that placed its model with .to("cuda:1") and never set the device:
    # torch believes it on GPU 0, where no context exists yet
    rt = _Runtime(believed=0)
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Stream=lambda device: _TorchStream(device), set_stream=rt.set_stream, stream=rt.stream, device=rt.device))
    monkeypatch.setattr(streams, "_torch", lambda: torch)
    monkeypatch.setattr(streams, "cuda", types.SimpleNamespace(gpus={1: rt._Gpu(rt, 1)},
                                                               external_stream=lambda handle: ("numba", handle)))
    monkeypatch.setattr(streams, "_pairs", {})
    monkeypatch.setattr(streams, "_local", threading.local())
    for landing in (False, True):
        with streams.working_on(_on(1), landing=landing):
            inside = (rt.stack[-1], rt.current[1], streams.stream())
        assert inside == (1, streams._pairs[1, int(landing)][1], streams._pairs[1, int(landing)][0])
    assert 0 not in rt.contexts, "working on GPU 1 made a context on GPU 0"
    assert rt.believed == 0, "torch's device for the thread was not given back"


def test_cross_barriers_updater_on_gpu_1_makes_no_context_on_gpu_0(monkeypatch):
    """The updater thread (torch believes it on GPU 0, without a context) queues a cuda:1
    parameter's step on the training thread's stream there: leaving that block must not set
    a stream on GPU 0, which would make a context there."""
    from gradpress.torch import cross_barrier
    rt = _Runtime(believed=0)
    monkeypatch.setattr(cross_barrier, "torch", types.SimpleNamespace(
        cuda=types.SimpleNamespace(stream=rt.stream, device=rt.device, set_stream=rt.set_stream)))
    with cross_barrier._on(_TorchStream(1)):
        assert rt.believed == 1 and rt.current[1].device == 1
    assert 0 not in rt.contexts, "leaving the training stream's block made a context on GPU 0"
    assert rt.believed == 0


class _Event:
    """torch's event recorded on GPU 1: its host waits note the GPU this thread had selected
    (None: none, and CUDA's runtime would make a context on GPU 0 for the wait)."""

    def __init__(self, selected: dict, done: bool = False):
        self.device = types.SimpleNamespace(type="cuda", index=1)
        self.selected, self.seen, self.done = selected, [], done

    def query(self) -> bool:
        self.seen.append(("query", self.selected.get(threading.get_ident())))
        return self.done

    def synchronize(self) -> None:
        self.seen.append(("synchronize", self.selected.get(threading.get_ident())))


def test_host_waits_on_a_gpu_1_event_run_with_gpu_1_selected(monkeypatch):
    """The host-copies thread's wait, and the communication thread's query and wait for a
    staged source's copy: each with the event's GPU current, on threads that own their GPU
    work (they select it and keep it)."""
    from gradpress.worker.jobs import PushPull
    from gradpress.worker.host_copies import HostCopies
    from gradpress.worker.stages import PartitionStages
    selected = {}
    monkeypatch.setattr(streams, "cuda", types.SimpleNamespace(
        select_device=lambda i: selected.__setitem__(threading.get_ident(), i)))
    monkeypatch.setattr(streams, "_local", threading.local())
    done, staged, finished, seen = _Event(selected), _Event(selected), threading.Event(), []
    copies = HostCopies(wake=finished.set)

    def communication():
        copies.after(done, lambda: None)      # not done yet: the host-copies thread waits for it
        job = types.SimpleNamespace(ready=staged, src=bytearray(4))
        seen.append(PushPull.filling(job))
        PartitionStages.await_source(job)
    thread = threading.Thread(target=communication)
    thread.owns_gpu_work = True
    thread.start()
    thread.join(5)
    assert finished.wait(5)
    copies.close(5)
    assert done.seen == [("query", 1), ("synchronize", 1)], done.seen
    assert seen == [staged] and staged.seen == [("query", 1), ("synchronize", 1)], staged.seen


def test_drain_queries_each_gpu_1_stream_mark_with_gpu_1_selected(monkeypatch):
    """At a job's end the communication thread waits for gradpress's streams on GPU 1: each
    query with GPU 1 current (none selected, CUDA would make a context on GPU 0 for it)."""
    selected, marks = {}, []
    monkeypatch.setattr(streams, "cuda", types.SimpleNamespace(
        select_device=lambda i: selected.__setitem__(threading.get_ident(), i)))
    monkeypatch.setattr(streams, "_local", threading.local())

    class Mark(_Event):
        def __init__(self):
            super().__init__(selected, done=True)
            marks.append(self)

        def record(self, stream) -> None:
            pass
    monkeypatch.setattr(streams, "_torch", lambda: types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Mark)))
    monkeypatch.setattr(streams, "_pairs", {(1, 0): (None, object()), (1, 1): (None, object())})
    drained = []
    thread = threading.Thread(target=lambda: drained.append(streams.drain(5.0)))
    thread.owns_gpu_work = True
    thread.start()
    thread.join(5)
    assert drained == [True] and len(marks) == 2
    assert all(m.seen == [("query", 1)] for m in marks), [m.seen for m in marks]


def test_gradpress_streams_on_gpu_1_are_made_with_gpu_1_selected(monkeypatch):
    """numba's handle of gradpress's stream belongs to the context current where it is made:
    first asked for outside ``working_on`` (``torch_stream``, say), on a thread that had
    selected no GPU or another, it went into GPU 0's, where launches on it fail."""
    selected, made = {}, []

    @contextlib.contextmanager
    def pushed(i):   # numba's context of GPU i pushed, popped after
        before = selected.get(threading.get_ident())
        selected[threading.get_ident()] = i
        yield
        selected[threading.get_ident()] = before
    monkeypatch.setattr(streams, "cuda", types.SimpleNamespace(
        select_device=lambda i: selected.__setitem__(threading.get_ident(), i), gpus={1: pushed(1), 2: pushed(2)},
        external_stream=lambda handle: made.append((handle, selected.get(threading.get_ident()))) or handle))
    monkeypatch.setattr(streams, "_local", threading.local())
    monkeypatch.setattr(streams, "_pairs", {})
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Stream=lambda device: types.SimpleNamespace(cuda_stream=f"stream on {device}"),
        device=lambda i: contextlib.nullcontext()))
    monkeypatch.setattr(streams, "_torch", lambda: fake_torch)
    after = []

    def on_gpu_2_then_1():   # inside a GPU 2 block, GPU 1's stream is made for the first time
        with streams.on_device(2):
            streams._pair(1)
            after.append(selected.get(threading.get_ident()))
    thread = threading.Thread(target=on_gpu_2_then_1)
    thread.owns_gpu_work = True
    thread.start()
    thread.join(5)
    assert made == [("stream on 1", 1)], made
    assert after == [2], "the thread was left on GPU 1 inside its GPU 2 block"


def test_a_gpu_1_keys_pinned_stage_is_made_with_gpu_1_selected(monkeypatch):
    """Pinned memory belongs to the context current where it is made (the communication
    thread's first copy of a key: none selected yet, CUDA would make one on GPU 0)."""
    from gradpress.kernels.cuda import device
    from gradpress.worker.stages import PartitionStages
    selected, pinned = {}, []
    monkeypatch.setattr(streams, "cuda", types.SimpleNamespace(
        select_device=lambda i: selected.__setitem__(threading.get_ident(), i)))
    monkeypatch.setattr(streams, "_local", threading.local())
    monkeypatch.setattr(device, "cuda", types.SimpleNamespace(pinned_array=lambda n, dtype: pinned.append(
        selected.get(threading.get_ident())) or np.empty(n, dtype)))
    stages = types.SimpleNamespace(host_stages={})
    wk = types.SimpleNamespace(key=7, count=4, tensor=types.SimpleNamespace(dtype="float32"))
    chunk = types.SimpleNamespace(device=torch.device("cuda", 1))
    thread = threading.Thread(target=lambda: PartitionStages._host_stage(stages, wk, chunk))
    thread.owns_gpu_work = True
    thread.start()
    thread.join(5)
    assert pinned == [1] and stages.host_stages[7].shape == (4,), pinned


def test_an_owning_thread_switching_gpus_keeps_its_context_stack_bounded(monkeypatch):
    """One process's model over two GPUs: its communication thread switches GPU at every
    partition, and numba's select_device pushes a context each time. The stack keeps one
    entry of gradpress's, the current GPU's, however many switches it makes."""
    rt = _Runtime(believed=0)
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Stream=lambda device: _TorchStream(device), set_stream=rt.set_stream, stream=rt.stream, device=rt.device))
    monkeypatch.setattr(streams, "_torch", lambda: torch)
    monkeypatch.setattr(streams, "cuda", types.SimpleNamespace(select_device=lambda i: rt.stack.append(i),
                                                               external_stream=lambda handle: ("numba", handle)))
    monkeypatch.setattr(streams, "_pop_context", lambda: rt.stack.pop())
    monkeypatch.setattr(streams, "_pairs", {})
    monkeypatch.setattr(streams, "_local", threading.local())
    depths = []

    def owner():
        for step in range(50):
            for index in (0, 1, 1, 0):
                with streams.working_on(_on(index), landing=step % 2 == 1):
                    assert rt.stack[-1] == index and rt.current[index] is streams._pairs[index, step % 2][1]
                    depths.append(len(rt.stack))
    _on_owning_thread(owner)
    assert len(depths) == 200 and max(depths) == 1, f"the context stack grew to {max(depths)}"
