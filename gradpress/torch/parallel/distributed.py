"""``DistributedDataParallel``: BytePS's DDP module, its gradients averaged by push_pull.

As in BytePS: the constructor broadcasts the module's state from rank 0; every forward
first broadcasts the buffers from rank 0 (``broadcast_buffers``); during backward each
gradient, once accumulated, is pushed, and the backward pass that produced the last
gradient waits for all of them, so that ``loss.backward()`` returns with averaged
gradients and a plain torch optimizer steps. Parameters a forward pass did not use (on
this worker, or on every one) get no gradient and fire no hook: at the end of the
backward pass (a callback queued on autograd's engine by its first gradient) they travel
as zeros, or as the gradient they hold, and the backward returns with every average, as
torch's DDP with ``find_unused_parameters=True`` (but one that no worker used is left with
zeros, as BytePS's DDP leaves it, where torch's leaves its gradient as it was). Left to the next step, the used ones
stayed unaveraged and the workers' models drifted apart without a word. Inside
``no_sync()`` gradients accumulate locally and go out with the next backward outside it.

Gradients travel in buckets, as torch's DDP sends them: parameters in reverse order
(roughly the order backward produces them), cut at ``bucket_cap_mb``; a bucket is
copied into one flat tensor and pushed when its last gradient is ready. Parameters
whose compression differs (``compression_params`` / ``compression_rules``, the job
file, BYTEPS_MIN_COMPRESS_BYTES) are never in one bucket. ``bucket_cap_mb=0`` gives
every parameter a bucket of its own, named ``Gradient.<name>`` as BytePS names it.
"""
from __future__ import annotations

import collections
import threading
import warnings
import weakref
from contextlib import contextmanager

import torch

from ...compressors.policy import CompressionPolicy
from ...pipeline import GradientPipeline, ParameterTable, frozen, gradient_or_zeros
from .. import ops
from ..broadcast import broadcast_parameters
from ..compression import Compression, check_compression

def _check_spec(table: ParameterTable, p: torch.Tensor) -> None:
    spec = table.spec[id(p)] or table.rule[id(p)]
    corrected = spec is not None and spec.compression_params.get("ef") == "corrected"
    if spec is not None and (spec.is_auto or spec.is_lowrank or corrected):
        raise ValueError(f"DistributedDataParallel: parameter {table.names[id(p)]!r}: compression {spec} needs "
                         f"the optimizer (learning rate, step times, a step's matrices); use "
                         f"DistributedOptimizer")


_made: collections.Counter = collections.Counter()  # job epoch -> DistributedDataParallel objects made
# each module's wrapper: a module wrapped again (torch's way to change what trains) leaves the
# earlier one, whose hooks would otherwise push every gradient once more
_wrapper_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class DistributedDataParallel(torch.nn.Module):
    """Wrap ``module`` so that backward averages its gradients over every worker.

    Args:
        module: the model; all its parameters and buffers exist by now.
        device_ids: BytePS's single-device list (one entry, or None on CPU).
        broadcast_buffers: broadcast the buffers from rank 0 at every forward.
        compression: ``Compression.none`` or ``Compression.fp16``.
        bucket_cap_mb: largest bucket, in MiB; 0: one bucket per parameter.
        compression_params / compression_rules: as for ``DistributedOptimizer``.
    """

    def __init__(self, module: torch.nn.Module, device_ids=None, broadcast_buffers: bool = True,
                 compression=Compression.none, *, bucket_cap_mb: float = 25.0,
                 compression_params: dict | None = None, compression_rules: list[tuple[str, dict]] | None = None):
        super().__init__()
        if device_ids is not None and len(device_ids) != 1:
            raise ValueError(f"DistributedDataParallel: device_ids must hold exactly one device, got {device_ids}")
        if ops.settings().enable_async:
            raise ValueError("DistributedDataParallel averages gradients: it cannot run with BYTEPS_ENABLE_ASYNC=1")
        if bucket_cap_mb < 0:
            raise ValueError(f"bucket_cap_mb={bucket_cap_mb}: must be >= 0")
        check_compression(compression, compression_params, "DistributedDataParallel")
        self.module = module
        self.device_ids = list(device_ids or [])
        self.broadcast_buffers = broadcast_buffers
        self._sync = True
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        # two wrapped models in one job (a GAN's two, whose parameter names may be the same)
        # must not share keys: the first keeps BytePS's names, the others are numbered in the
        # order every worker wraps them (per job: a worker that joined at a resume counts
        # from 0 as those there before it do)
        instance = _made[ops.job_epoch()]
        _made[ops.job_epoch()] += 1
        self._prefix = "" if instance == 0 else f"ddp{instance}."
        table = ParameterTable([p for _, p in named], named,
                               CompressionPolicy.for_job(ops.settings(), compression_params, compression_rules))
        for p in table.trainable:
            _check_spec(table, p)
        if any(spec is not None and spec.compression_params.get("momentum") for spec in table.spec.values()):
            warnings.warn("DistributedDataParallel: compression_params with momentum keep Nesterov momentum on the "
                          "workers before compression; DDP cannot turn the optimizer's own momentum off, as "
                          "DistributedOptimizer folds it: build the optimizer with momentum=0, or momentum is "
                          "applied twice", stacklevel=2)
        self._gradpress = GradientPipeline(table, f"Gradient.{self._prefix}", compression=compression,
                                           bucket_bytes=bucket_cap_mb * (1 << 20), fill=gradient_or_zeros,
                                           owner="DistributedDataParallel")
        self._param = {id(p): p for p in table.trainable}
        earlier = _wrapper_of.get(module)
        if earlier is not None:  # its hooks go, as torch's earlier reducer stops acting
            earlier._leave()
        _wrapper_of[module] = self
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for _, p in named]
        self._every = list(module.parameters())  # frozen ones too: they may be unfrozen later
        self._late: list[torch.Tensor] = []  # this backward's parameters unfrozen since wrapping
        # a model over several GPUs: autograd runs each device's hooks on a thread of its own
        self._submitting = threading.Lock()
        if module.state_dict():
            broadcast_parameters(module.state_dict(), root_rank=0, prefix=f"Parameter.{self._prefix}")

    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers:
            buffers = list(self.module.named_buffers())
            if buffers:
                broadcast_parameters(buffers, root_rank=0, prefix=f"Buffer.{self._prefix}")
        return self.module(*inputs, **kwargs)

    def _leave(self) -> None:
        """The module was wrapped again: this wrapper's gradients no longer travel."""
        for hook in self._hooks:
            hook.remove()
        self._hooks, self._every = [], []

    @contextmanager
    def no_sync(self):
        """Accumulate gradients locally; the next backward outside the block pushes them."""
        before, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = before

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self._sync:
            return
        pipeline = self._gradpress
        with self._submitting:  # one thread at a time submits, and exactly one sees the last
            if not pipeline.any_submitted:  # this backward's first gradient: finish at its end
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
                # a check per backward, on the hook thread: over the parameters kept at wrapping
                # (8 us for 102; walking the module again took 90), names only where one is found
                self._late = [q for q in self._every if q.requires_grad and id(q) not in self._param]
            pipeline.submit(p, p.grad)
            last = pipeline.all_submitted and not self._late
        if last:
            self.synchronize()  # the last gradient of this backward: finish before it returns

    def _backward_done(self) -> None:
        if self._late:
            self._adopt_late()
        if self._gradpress.any_submitted:  # parameters this backward did not reach
            self.synchronize()

    def _adopt_late(self) -> None:
        """Parameters unfrozen since wrapping join at the end of the backward that first made
        their gradients (which travel with this step's, as every worker unfreezes them at the
        same step), then as the others do. torch's DDP leaves them out: each worker would
        step on its own gradient, and the models drift apart."""
        ids, self._late = {id(p) for p in self._late}, []
        late = [(name, p) for name, p in self.module.named_parameters() if id(p) in ids]
        for name, p in late:
            self._gradpress.adopt(p, name)
            _check_spec(self._gradpress.table, p)
            self._param[id(p)] = p
            self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))
        warnings.warn(f"DistributedDataParallel: {', '.join(n for n, _ in late)} became trainable after "
                      f"wrapping; averaged from this step on", stacklevel=2)

    def synchronize(self) -> None:
        """Finish every gradient's push_pull (pushing those this backward did not reach); a
        backward has done it by itself, so after one there is nothing left to do."""
        if not self._gradpress.any_submitted:
            return
        for pid, out in self._gradpress.finish().items():
            p = self._param[pid]
            if out is not p.grad and not frozen(p):
                with torch.no_grad():
                    p.grad.copy_(out)
