"""``DistributedOptimizer``: push_pull each gradient as soon as backward produces it.

A hook on every parameter starts that gradient's push_pull the moment it has been
accumulated, so communication overlaps the rest of backward; ``step()`` waits for
them all, writes the averages into ``.grad`` and steps the wrapped optimizer.
Parameters earlier in the model get higher priority: the next forward pass needs
them first.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ..compressors.policy import CompressionPolicy
from ..compressors.spec import CodecSpec
from . import ops
from .compression import Compression


class _DistributedOptimizer(torch.optim.Optimizer):
    # The wrapped optimizer's class, set on each generated class: methods call it by name,
    # not through super(self.__class__, ...), which recurses forever in a subclass.
    _gp_base: type = torch.optim.Optimizer

    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 compression_params=None, compression_rules=None):
        self._gp_base.__init__(self, params)
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
                raise ValueError("named_parameters must be a sequence of (name, parameter) tuples, "
                                 "as model.named_parameters() gives")
            names = [n for n, _ in named]
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                raise ValueError(f"parameter names must be unique; duplicated: {', '.join(dups)}")
            by_id = {id(p): n for n, p in named}
            unnamed = [p for p in all_params if id(p) not in by_id]
            if unnamed:
                raise ValueError(f"{len(unnamed)} parameter(s) of the optimizer are missing from "
                                 f"named_parameters (shapes {[tuple(p.shape) for p in unnamed][:5]})")
        else:
            by_id = {id(p): f"param.{i}" for i, p in enumerate(all_params)}
        order = {id(p): i for i, p in enumerate(all_params)}
        self._gp_names = {id(p): by_id[id(p)] for p in all_params}
        self._gp_priority = {id(p): -order[id(p)] for p in all_params}
        self._gp_params = [p for p in all_params if p.requires_grad]
        self._gp_delay = {id(p): backward_passes_per_step for p in self._gp_params}
        self._gp_handles: dict[int, tuple[torch.Tensor, int, object]] = {}
        self._gp_should_sync = True
        self._gp_group = {id(p): group for group in self.param_groups for p in group["params"]}
        self._gp_spec = self._gp_compression(compression_params, compression_rules)
        self._gp_hooks = [p.register_post_accumulate_grad_hook(self._gp_hook) for p in self._gp_params]
        for p in self._gp_params:
            ops.declare("Gradient." + self._gp_names[id(p)])

    def _gp_hook(self, p: torch.Tensor) -> None:
        key = id(p)
        if self._gp_delay[key] <= 0:
            raise AssertionError("gradients were computed more than backward_passes_per_step times "
                                 "before step(); raise backward_passes_per_step to accumulate locally")
        self._gp_delay[key] -= 1
        if self._gp_delay[key] == 0:
            self._gp_start(p)

    def _gp_compression(self, default, rules) -> dict:
        """Each parameter's CodecSpec (None: uncompressed), from the job file and the arguments.

        As in BytePS, when the gradients carry Nesterov momentum the wrapped optimizer's own
        momentum is turned off (it would be applied twice) and its coefficient is used.
        """
        policy = CompressionPolicy.for_job(ops.settings(), default, rules)
        specs = {}
        for p in self._gp_params:
            spec = policy.for_tensor(self._gp_names[id(p)], p.numel() * p.element_size(),
                                     str(p.dtype).replace("torch.", ""))
            group = self._gp_group[id(p)]
            params = spec.compression_params if spec else {}
            if params.get("momentum") and group.get("momentum"):
                spec = CodecSpec.from_params(dict(params, mu=params.get("mu", group["momentum"])))
                group["momentum"] = 0
            specs[id(p)] = spec
        return specs

    def _gp_start(self, p: torch.Tensor) -> None:
        compressed, ctx = self._compression.compress(p.grad)
        spec = self._gp_spec[id(p)]
        if spec is not None and not spec.accepts(str(compressed.dtype).replace("torch.", "")):
            spec = None  # Compression.fp16 made it float16: it travels as such
        handle = ops.push_pull_async_inplace(compressed, average=True, name="Gradient." + self._gp_names[id(p)],
                                             priority=self._gp_priority[id(p)], compression_params=spec,
                                             lr=self._gp_group[id(p)]["lr"] if spec else None)
        self._gp_handles[id(p)] = (p, handle, ctx)

    def synchronize(self) -> None:
        """Finish every gradient's push_pull (starting those backward did not reach)."""
        for p in self._gp_params:
            if id(p) not in self._gp_handles:
                if p.grad is None:  # unused in this backward: every worker must still take part
                    p.grad = torch.zeros_like(p)
                self._gp_start(p)
        try:
            for p, handle, ctx in self._gp_handles.values():
                out = ops.synchronize(handle)
                result = self._compression.decompress(out, ctx)
                if result is not p.grad:
                    with torch.no_grad():
                        p.grad.copy_(result)
        finally:
            self._gp_handles.clear()
            for p in self._gp_params:
                self._gp_delay[id(p)] = self.backward_passes_per_step

    @contextmanager
    def skip_synchronize(self):
        """Use after an explicit ``synchronize()``, so ``step()`` does not wait again."""
        self._gp_should_sync = False
        try:
            yield
        finally:
            self._gp_should_sync = True

    def step(self, closure=None):
        if self._gp_should_sync:
            self.synchronize()
        return self._gp_base.step(self, closure)

    def zero_grad(self, set_to_none: bool = True):
        if self._gp_handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize()")
        return self._gp_base.zero_grad(self, set_to_none)


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                         compression=Compression.none, backward_passes_per_step: int = 1,
                         staleness: int = 0, compression_params: dict | None = None,
                         compression_rules: list[tuple[str, dict]] | None = None):
    """Wrap ``optimizer`` so that ``step()`` applies gradients averaged over all workers.

    Args:
        optimizer: any torch optimizer; its class is kept (``isinstance`` still holds).
        named_parameters: ``model.named_parameters()``; names become tensor names, so
            they must be the same on every worker.
        compression: ``Compression.none`` or ``Compression.fp16``.
        backward_passes_per_step: backward passes accumulated locally before a push_pull.
        staleness: accepted for BytePS compatibility; only 0 (synchronous) is supported.
        compression_params: BytePS's dict (compressor, ef, momentum, k, seed, ...): every
            float32 gradient of at least BYTEPS_MIN_COMPRESS_BYTES is compressed both ways,
            with error feedback on workers and servers. The learning rate of each
            parameter's group travels with its push (corrected error feedback needs it).
        compression_rules: ``[(pattern, params), ...]``: fnmatch patterns on parameter
            names, first match wins over ``compression_params`` (``{"compressor": "none"}``
            exempts). The job file's ``[compression]`` table applies below both.
    """
    if staleness != 0:
        raise ValueError(f"staleness={staleness}: only synchronous training (staleness=0) is supported")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step={backward_passes_per_step}: must be at least 1")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__, _gp_base=optimizer.__class__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               compression_params, compression_rules)
