"""Ordering on a GPU worker that the device's streams and autograd's threads need.
``CrossBarrier``'s updater queues each parameter's step on the training thread's CUDA
stream as it was at ``step()``: a forward or backward on a stream of its own
(``torch.cuda.stream(s)``) does not wait for the updater thread's default stream, and the
threading event the forward hook waits for only says the update was queued. DDP over a
model on two GPUs finishes each backward once. Stand-ins take torch's CUDA parts and
autograd's device threads (this host has no GPU)."""
import contextlib
import queue
import threading
from types import SimpleNamespace

import torch

from gradpress.torch import cross_barrier


def test_the_updater_queues_each_update_on_the_training_threads_stream(monkeypatch):
    side = {i: SimpleNamespace(name=f"side stream of cuda:{i}", device=torch.device("cuda", i)) for i in (0, 1)}
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: side[device.index])
    on_gpu = [SimpleNamespace(is_cuda=True, device=torch.device("cuda", i)) for i in (0, 1, 1)]
    on_host = SimpleNamespace(is_cuda=False, device=torch.device("cpu"))
    streams = cross_barrier.training_streams(on_gpu + [on_host])
    assert streams == {torch.device("cuda", 0): side[0], torch.device("cuda", 1): side[1]}

    current = []

    @contextlib.contextmanager
    def stream(s):
        current.append(s)
        yield
        current.pop()
    monkeypatch.setattr(torch.cuda, "stream", stream)
    entered = []   # the stream's device entered first (tests/kernels/test_streams_devices.py says why)
    monkeypatch.setattr(torch.cuda, "device", lambda d: entered.append(d) or contextlib.nullcontext())
    barrier = cross_barrier._CrossBarrier.__new__(cross_barrier._CrossBarrier)
    barrier._error, barrier._work = None, queue.Queue()
    batch = on_gpu[:2] + [on_host]
    barrier._ready = {id(p): threading.Event() for p in batch}
    updated = []
    barrier._update = lambda p, hyper: updated.append((p.device, list(current), hyper))
    barrier._work.put((batch, {id(p): {"lr": 0.1} for p in batch}, streams))
    barrier._work.put(cross_barrier._STOP)
    barrier._update_loop()
    assert updated == [(torch.device("cuda", 0), [side[0]], {"lr": 0.1}),
                       (torch.device("cuda", 1), [side[1]], {"lr": 0.1}),
                       (torch.device("cpu"), [], {"lr": 0.1})]   # a host parameter: no stream
    assert entered == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert all(barrier._ready[id(p)].is_set() for p in batch)
    # synchronize(), say for an evaluation on another stream: that stream waits for the updates'
    waited = []

    class Default:
        def __init__(self, device):
            self.device = device

        def wait_stream(self, s):
            waited.append((self.device.index, s))
    monkeypatch.setattr(torch.cuda, "current_stream", Default)
    barrier._streams = streams
    barrier._wait = lambda event: None
    barrier.synchronize()
    assert sorted(waited) == [(0, side[0]), (1, side[1])]


def test_a_ddp_model_over_two_gpus_finishes_its_backward_once(monkeypatch):
    """Autograd runs each device's gradient hooks on a thread of its own: two hooks submitting
    at once must not both see the last gradient submitted (two finishes, one of them flushing
    a bucket the other thread is still filling)."""
    import time

    from gradpress.torch.parallel.distributed import DistributedDataParallel

    class Pipeline:
        trainable = 2

        def __init__(self):
            self.given = []

        @property
        def any_submitted(self):
            return True   # (the first gradient's callback is autograd's: past here)

        @property
        def all_submitted(self):
            return len(self.given) == self.trainable

        def submit(self, p, grad):
            self.given.append(p)
            time.sleep(0.05)   # a bucket's copies and its start, the GIL let go meanwhile
    ddp = DistributedDataParallel.__new__(DistributedDataParallel)
    finished = []
    vars(ddp).update(_sync=True, _gradpress=Pipeline(), _late=[], _submitting=threading.Lock(),
                     synchronize=lambda: finished.append(threading.current_thread().name))
    hooks = [threading.Thread(target=ddp._on_grad, args=(SimpleNamespace(grad=None),), name=f"cuda:{i}")
             for i in range(2)]
    for hook in hooks:
        hook.start()
    for hook in hooks:
        hook.join(10)
    assert len(finished) == 1, finished


def test_a_distributed_optimizers_hook_threads_submit_one_at_a_time():
    """The same for DistributedOptimizer's hooks: a bucket's members, the sparse-density vote
    and the planner are filled by one thread at a time."""
    import time

    from gradpress.torch.optimizer import _DistributedOptimizer

    class Pipeline:
        inside, most, given = 0, 0, []

        def submit(self, p, grad):
            Pipeline.inside += 1
            Pipeline.most = max(Pipeline.most, Pipeline.inside)
            time.sleep(0.05)   # the GIL let go meanwhile
            Pipeline.given.append(p)
            Pipeline.inside -= 1
    opt = _DistributedOptimizer.__new__(_DistributedOptimizer)
    params = [SimpleNamespace(grad=None) for _ in range(2)]
    vars(opt).update(_gradpress=Pipeline(), _submitting=threading.Lock(),
                     _passes_left={id(p): 1 for p in params})
    hooks = [threading.Thread(target=opt._on_gradient, args=(p,)) for p in params]
    for hook in hooks:
        hook.start()
    for hook in hooks:
        hook.join(10)
    assert Pipeline.most == 1 and sorted(map(id, Pipeline.given)) == sorted(map(id, params))


def test_a_forward_on_another_stream_than_steps_waits_for_the_updates_there(monkeypatch):
    """``step()`` outside the loop's ``torch.cuda.stream(s)`` block (or the other way round):
    the updates were queued on step()'s stream, which the forward's does not wait for by
    itself; on the same stream nothing is added."""
    step_stream = SimpleNamespace(name="step's stream")
    waited, now = [], {}

    class Current:
        def __init__(self, device):
            self.name = now["stream"]

        def __eq__(self, other):
            return self.name == getattr(other, "name", None)

        def wait_stream(self, s):
            waited.append((self.name, s.name))
    monkeypatch.setattr(torch.cuda, "current_stream", Current)
    layer = torch.nn.Linear(2, 2)
    barrier = cross_barrier._CrossBarrier.__new__(cross_barrier._CrossBarrier)
    barrier._ready = {id(p): threading.Event() for p in layer.parameters()}
    barrier._wait = lambda event: None   # (the updates are queued)
    barrier._streams = {p.device: step_stream for p in layer.parameters()}
    now["stream"] = "step's stream"
    barrier._before_forward(layer, ())
    assert waited == []
    now["stream"] = "the loop's stream"
    barrier._before_forward(layer, ())
    assert waited == [("the loop's stream", "step's stream")] * 2
