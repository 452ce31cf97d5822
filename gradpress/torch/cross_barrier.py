"""``CrossBarrier``: the next forward pass starts layer by layer as each parameter lands.

BytePS's wrapper around ``DistributedOptimizer`` (after ByteScheduler, SOSP'19): ``step()``
does not wait for the push_pulls. An updater thread takes each parameter as its average
arrives, in the order the next forward pass needs them, steps that one parameter with
the wrapped optimizer's own algorithm and zeroes its gradient; a hook before each
module's forward waits only for that module's parameters. Communication of the last
layers thus overlaps the computation of the first ones of the next iteration.

Each parameter is stepped by a one-parameter instance of the wrapped optimizer's class
that shares its state and takes its group's hyper-parameters as they were at
``step()``, so any torch optimizer works and the parameters are bit-identical to a
plain ``DistributedOptimizer``'s (one that steps them all at once, per tensor, as
torch does on CPU). ``zero_grad()`` is a no-op (the updater zeroes each gradient);
call ``synchronize()`` before reading parameters outside a forward pass (checkpoints,
evaluation). Differences from BytePS: every ``step()`` crosses the barrier (BytePS
steps the first one locally), and any optimizer works, not only SGD, Adam and RMSprop.
On a GPU the updater queues its work on the training thread's stream as of ``step()``
(``training_streams``), so a training loop on a stream of its own is ordered after it; a
forward on another stream than ``step()``'s waits for that one on the device.
"""
from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import types

import torch

from ..errors import JobError, OpTimeoutError
from ..optim import loss_scaling
from . import ops
from .broadcast import broadcast_optimizer_state, broadcast_parameters  # noqa: F401  byteps.torch.cross_barrier's names
from .compression import Compression
from .ops import init, local_rank, local_size, poll, rank, shutdown, size, synchronize  # noqa: F401  (as BytePS's)
from .ops import push_pull_async_inplace as byteps_push_pull  # noqa: F401
from .optimizer import DistributedOptimizer, constructor_args

log = logging.getLogger(__name__)
_STOP = object()
FATAL_CHECK_S = 0.5  # how often a wait for an update asks whether the job failed meanwhile


class _CrossBarrier(torch.optim.Optimizer):
    # An Optimizer, as BytePS's (an LR scheduler takes it), that never ran Optimizer's
    # __init__: its groups, state and methods are the wrapped DistributedOptimizer's
    # (``__getattr__``, and Optimizer's own methods delegated below the class).
    # (torch.amp.GradScaler then calls step() on every worker, which refuses it there at the
    # same step: left to itself the scaler skipped step() on some workers, whose rounds then
    # hung, and unscaled gradients still landing)
    _step_supports_amp_scaling = True

    def __init__(self, model: torch.nn.Module, opt, num_steps: int = 10 ** 6):
        if ops.settings().enable_async:
            raise ValueError("CrossBarrier overlaps gradient push_pulls: it cannot run with BYTEPS_ENABLE_ASYNC=1")
        self._model, self._opt = model, opt
        self._pipeline = opt._gradpress
        self._step, self._final_step = 0, num_steps
        self._streams: dict = {}   # where the last step's updates were queued, by device
        self._forward_order: dict[int, int] = {}
        self._ready: dict[int, threading.Event] = {}
        self._single: dict[int, torch.optim.Optimizer] = {}
        self._error: BaseException | None = None
        self._base = type(opt).__bases__[1]  # the wrapped optimizer's class (DistributedOptimizer's second base)
        self._base_args = constructor_args(self._base, opt.defaults)
        for p in self._pipeline.table.trainable:
            self._track(p)
        self._pipeline.listener = self._started
        self._hooks = [m.register_forward_pre_hook(self._before_forward)
                       for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
        self._work: queue.Queue = queue.Queue()
        self._updater = threading.Thread(target=self._update_loop, name="gp-cross-barrier", daemon=True)
        self._updater.start()

    def _track(self, p: torch.Tensor) -> None:
        """``p``'s place in the forward order, its landed event (set: nothing in flight) and
        its one-parameter optimizer sharing the wrapped one's state."""
        self._forward_order[id(p)] = len(self._forward_order)
        self._ready[id(p)] = threading.Event()
        self._ready[id(p)].set()
        single = self._base([{**self._hyper(p), "params": [p]}], **self._base_args)
        single.state = self._opt.state
        self._single[id(p)] = single

    def __getattr__(self, item):
        return getattr(self._opt, item)

    # ---- the training thread ------------------------------------------------

    def _hyper(self, p: torch.Tensor) -> dict:
        """``p``'s group's hyper-parameters as they are now."""
        return {k: v for k, v in self._opt._groups[id(p)].items() if k != "params"}

    def _started(self, p: torch.Tensor) -> None:
        self._ready[id(p)].clear()

    def _before_forward(self, module: torch.nn.Module, inputs) -> None:
        for p in module.parameters(recurse=False):
            event = self._ready.get(id(p))
            if event is not None:
                self._wait(event)
                queued = self._streams.get(p.device)  # a forward on another stream than step()'s waits for
                if queued is not None and torch.cuda.current_stream(p.device) != queued:  # the update there
                    torch.cuda.current_stream(p.device).wait_stream(queued)

    def _wait(self, event: threading.Event) -> None:
        timeout_s = ops.settings().op_timeout_s + 5
        deadline = time.monotonic() + timeout_s
        while not event.wait(min(FATAL_CHECK_S, max(0.0, deadline - time.monotonic()))):
            ops.client()  # the job's fatal error (a lost peer), after which no update arrives, raised now
            if time.monotonic() >= deadline:
                raise OpTimeoutError(f"CrossBarrier: a parameter's update did not arrive within {timeout_s:g} s")
        if self._error is not None:
            raise JobError(f"CrossBarrier: updating the parameters failed: {self._error!r}") from self._error

    def step(self, closure=None):
        """Start the push_pulls backward did not reach and return; the updater steps each
        parameter as its average lands."""
        if self.__dict__.get("found_inf") is not None:  # set by a GradScaler for this call
            loss_scaling.forget(self)  # (the scaler removes them only once step() returns)
            raise ValueError("CrossBarrier does not support loss scaling (torch.amp.GradScaler): it steps each "
                             "parameter as its average lands, before any step could know whether another "
                             "average overflowed (BytePS's CrossBarrier has none either); train with "
                             "DistributedOptimizer or DistributedDataParallel under a GradScaler")
        if self._error is not None:
            raise JobError(f"CrossBarrier: updating the parameters failed: {self._error!r}") from self._error
        loss = closure() if closure is not None else None
        pipeline = self._pipeline
        for _, p in self._opt._adopt_late():  # unfrozen, or added with add_param_group: they join now
            self._track(p)
        pipeline.flush()
        batch = sorted(pipeline.submitted(), key=lambda p: self._forward_order[id(p)])
        # hyper-parameters as of this step: an LR scheduler may change them before the updater runs
        hyper = {id(p): self._hyper(p) for p in batch}
        pipeline.next_step()
        self._opt.set_backward_passes_per_step(self._opt.backward_passes_per_step)
        self._streams = training_streams(batch)
        self._work.put((batch, hyper, self._streams))
        self._step += 1
        if self._step >= self._final_step:
            self.synchronize()
            self._work.put(_STOP)
            self._updater.join(timeout=5)
        return loss

    def synchronize(self) -> None:
        """Wait until every parameter has been updated; on a GPU the caller's stream waits
        (on the device) for those the updates were queued on, should it be another."""
        for event in self._ready.values():
            self._wait(event)
        for device, stream in self._streams.items():
            torch.cuda.current_stream(device).wait_stream(stream)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """A no-op: the updater zeroes each gradient once its parameter is updated."""

    # ---- the updater thread ---------------------------------------------------

    def _update_loop(self) -> None:
        while (item := self._work.get()) is not _STOP:
            batch, hyper, streams = item
            for p in batch:
                try:
                    if self._error is None:
                        with _on(streams.get(p.device)):
                            self._update(p, hyper[id(p)])
                except BaseException as e:  # surfaced in the training thread at its next wait
                    log.exception("CrossBarrier: updating a parameter failed")
                    self._error = e
                finally:
                    self._ready[id(p)].set()

    def _update(self, p: torch.Tensor, hyper: dict) -> None:
        out = self._pipeline.finish_one(p)
        if not p.requires_grad:  # frozen since it was wrapped: not stepped, its gradient cleared as
            p.grad = None        # zero_grad() (here a no-op) would have, so that torch's optimizers skip it
            return
        if out is not p.grad:
            p.grad = out
        single = self._single[id(p)]
        single.param_groups[0].update(hyper)
        single.state = self._opt.state  # load_state_dict (broadcast_optimizer_state) replaces it
        single.step()
        with torch.no_grad():
            p.grad.zero_()


def _delegated(name: str):
    def call(self, *args, **kwargs):
        return getattr(self._opt, name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    return call


for _name, _member in vars(torch.optim.Optimizer).items():  # (its static methods need no instance)
    if isinstance(_member, types.FunctionType) and not _name.startswith("__") and _name not in vars(_CrossBarrier):
        setattr(_CrossBarrier, _name, _delegated(_name))


def training_streams(params: list[torch.Tensor]) -> dict[torch.device, object]:
    """The training thread's current CUDA stream on each device of ``params``. The updater
    queues each parameter's wait for its average, its step and its gradient's zeroing there:
    the next forward and backward, queued after it sees the parameter updated, are ordered
    after them on the device even where they run on a stream of their own
    (``torch.cuda.stream(s)``), which does not wait for the updater thread's default one."""
    return {p.device: torch.cuda.current_stream(p.device) for p in params if p.is_cuda}


@contextlib.contextmanager
def _on(stream):
    """``stream`` current on this thread, its device entered first: leaving a bare stream
    block sets the stream back on the device torch believes current, GPU 0 on a new thread,
    which makes a context there (``kernels/cuda/streams._switched`` says more)."""
    if stream is None:
        yield
        return
    with torch.cuda.device(stream.device), torch.cuda.stream(stream):
        yield


def CrossBarrier(model: torch.nn.Module, optimizer: torch.optim.Optimizer, named_parameters=None,
                 compression=Compression.none, backward_passes_per_step: int = 1, num_steps: int = 10 ** 6,
                 **distributed_kwargs):
    """Wrap ``optimizer`` in a ``DistributedOptimizer`` whose ``step()`` does not wait.

    Args:
        model: the model whose modules' forward passes wait for their own parameters.
        optimizer, named_parameters, compression, backward_passes_per_step: as for
            ``DistributedOptimizer`` (and its keyword arguments: ``compression_params``, ...).
        num_steps: after this many steps, wait for the last updates and stop the updater.
    """
    opt = DistributedOptimizer(optimizer, named_parameters, compression, backward_passes_per_step,
                               **distributed_kwargs)
    return _CrossBarrier(model, opt, num_steps)
