"""``DistributedOptimizer``: push_pull each gradient as soon as backward produces it.

A hook on every parameter starts that gradient's push_pull the moment it has been
accumulated, so communication overlaps the rest of backward; ``step()`` waits for
them all, writes the averages into ``.grad`` and steps the wrapped optimizer.
Parameters earlier in the model get higher priority: the next forward pass needs
them first.

Async mode (BYTEPS_ENABLE_ASYNC=1), as in BytePS: the servers hold the parameters,
initialised from rank 0 when the optimizer is built; ``step()`` steps locally, pushes
the change it made to each parameter and pulls the servers' current parameters.
"""
from __future__ import annotations

import time
import warnings
import zlib
from contextlib import contextmanager

import torch

from ..compressors.policy import CompressionPolicy
from ..compressors.spec import CodecSpec
from . import ops
from .compression import Compression
from .sparse import RowRouting


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
            # as in BytePS, only trainable parameters need a name: frozen ones never travel
            unnamed = [p for p in all_params if id(p) not in by_id and p.requires_grad]
            if unnamed:
                raise ValueError(f"{len(unnamed)} trainable parameter(s) of the optimizer are missing from "
                                 f"named_parameters (shapes {[tuple(p.shape) for p in unnamed][:5]})")
        else:
            by_id = {id(p): f"param.{i}" for i, p in enumerate(all_params)}
        order = {id(p): i for i, p in enumerate(all_params)}
        self._gp_names = {id(p): by_id.get(id(p), f"frozen.{order[id(p)]}") for p in all_params}
        self._gp_priority = {id(p): -order[id(p)] for p in all_params}
        self._gp_params = [p for p in all_params if p.requires_grad]
        self._gp_delay = {id(p): backward_passes_per_step for p in self._gp_params}
        self._gp_handles: dict[int, tuple[torch.Tensor, int, object]] = {}
        self._gp_should_sync = True
        self._gp_index_groups()
        self._gp_listener = None  # called with (p, handle, ctx) as each push_pull starts (CrossBarrier)
        self._gp_async = ops.settings().enable_async
        if self._gp_async:
            if compression_params or compression_rules:
                raise ValueError("BYTEPS_ENABLE_ASYNC=1: asynchronous training pushes uncompressed parameter "
                                 "deltas; drop compression_params / compression_rules")
            if compression is not Compression.none:  # BytePS pushes the deltas uncompressed too
                warnings.warn("BYTEPS_ENABLE_ASYNC=1: compression is ignored, as in BytePS: parameter "
                              "deltas travel uncompressed", stacklevel=3)
            self._gp_hooks, self._gp_auto, self._gp_lowrank, self._gp_lowrank_ids = [], None, None, set()
            self._gp_async_init()
            return
        self._gp_spec = self._gp_compression(compression_params, compression_rules)
        self._gp_rows = RowRouting(ops.settings().sparse_density, ops.push_pull_async, ops.synchronize)
        self._gp_lowrank = self._gp_low_rank(compression_params, compression_rules)
        self._gp_auto = self._gp_planner(compression_params, compression_rules)
        self._gp_hooks = [p.register_post_accumulate_grad_hook(self._gp_hook) for p in self._gp_params]
        for p in self._gp_params:
            ops.declare("Gradient." + self._gp_names[id(p)])

    def _gp_async_init(self) -> None:
        """Round 0 of every parameter's key: the servers' store becomes rank 0's values."""
        root = ops.rank() == 0
        handles = []
        with torch.no_grad():
            for p in self._gp_params:
                if not root:
                    p.zero_()
                handles.append(ops.push_pull_async_inplace(p.data, average=False, priority=self._gp_priority[id(p)],
                                                           name="AsyncParam." + self._gp_names[id(p)]))
            for h in handles:
                ops.synchronize(h)

    def _gp_async_step(self, closure):
        """Step locally, push each parameter's change, pull the servers' parameters."""
        before = [p.detach().clone() for p in self._gp_params]
        loss = self._gp_base.step(self, closure)
        handles = []
        with torch.no_grad():
            for p, old in zip(self._gp_params, before):
                p.sub_(old)  # the delta travels in the parameter's own memory and is replaced by the pull
                handles.append(ops.push_pull_async_inplace(p.data, average=False, priority=self._gp_priority[id(p)],
                                                           name="AsyncParam." + self._gp_names[id(p)]))
            for h in handles:
                ops.synchronize(h)
        return loss

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Accumulate ``passes`` backward passes locally before each push_pull, from now on
        (BytePS's method; a count already under way starts again)."""
        if passes < 1:
            raise ValueError(f"set_backward_passes_per_step({passes}): must be at least 1")
        self.backward_passes_per_step = passes
        for key in self._gp_delay:
            self._gp_delay[key] = passes

    def _gp_hook(self, p: torch.Tensor) -> None:
        key = id(p)
        if self._gp_delay[key] <= 0:
            raise AssertionError("gradients were computed more than backward_passes_per_step times "
                                 "before step(); raise backward_passes_per_step to accumulate locally")
        self._gp_delay[key] -= 1
        if self._gp_delay[key] == 0:
            if self._gp_lowrank is not None and key in self._gp_lowrank_ids:
                return  # reduced with the other low-rank gradients in synchronize()
            if self._gp_auto is not None and self._gp_auto.manages(p) and self._gp_auto.on_ready(p):
                return  # the plan sends it, in its group
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

    def _gp_low_rank(self, default, rules):
        """The reducer of the gradients whose compression is powersgd or acpsgd (small and 1-D
        ones included: it sends those uncompressed, fused), or None."""
        policy = CompressionPolicy.for_job(ops.settings(), default, rules)
        specs = {id(p): spec for p in self._gp_params
                 if (spec := policy.rule_for(self._gp_names[id(p)])) is not None and spec.is_lowrank}
        self._gp_lowrank_ids = set(specs)
        if not specs:
            return None
        if len(set(specs.values())) > 1:
            raise ValueError("powersgd / acpsgd: every low-rank gradient must have the same compression_params "
                             f"(they are reduced together); got {sorted({str(s) for s in specs.values()})}")
        if self._compression is not Compression.none:
            raise ValueError("compression_params powersgd / acpsgd factor the float32 gradients themselves; "
                             "leave compression=Compression.none")
        from ..compressors.lowrank import LowRankParams
        from .lowrank import LowRankReducer
        entries = [(self._gp_names[id(p)], p) for p in self._gp_params if id(p) in specs]
        # its fused tensors' names: the same for every optimizer of these parameter names (a resumed one)
        prefix = f"Gradient.{zlib.crc32(','.join(n for n, _ in entries).encode()):08x}."
        return LowRankReducer(entries, LowRankParams.parse(next(iter(specs.values())).compression_params),
                              prefix, ops.settings().min_compress_bytes)

    def _gp_planned(self, p: torch.Tensor) -> bool:
        """Whether ``p``'s gradient travels in the planner's fused groups now."""
        return self._gp_auto is not None and self._gp_auto.plan is not None and self._gp_auto.manages(p)

    def _gp_planner(self, default, rules):
        """The planner for the gradients whose compression is ``auto`` (with their small ones:
        the plan fuses those), or None. Until its plan exists they travel raw."""
        policy = CompressionPolicy.for_job(ops.settings(), default, rules)
        managed = [p for p in self._gp_params if p.dtype == torch.float32
                   and (spec := policy.rule_for(self._gp_names[id(p)])) is not None and spec.is_auto]
        if not managed:
            return None
        if self._compression is not Compression.none:
            raise ValueError("compression_params 'auto' plans each gradient's compression itself; "
                             "leave compression=Compression.none")
        from .auto_plan import AutoPlanner
        return AutoPlanner(managed, self._gp_names, self._gp_priority,
                           {id(p): self._gp_group[id(p)]["lr"] for p in managed},
                           next(spec for p in managed if (spec := policy.rule_for(self._gp_names[id(p)]))
                                ).compression_params, leave_out=self._gp_rows.sends_rows, views=True)

    def _gp_start(self, p: torch.Tensor) -> None:
        compressed, ctx = self._compression.compress(p.grad)
        route, compressed = self._gp_rows.route(p, self._gp_names[id(p)], compressed)
        if route is not None:  # row-sparse: its rows travel exactly, hashed over the servers
            start = ops.push_pull_async_inplace if route == "coo" else ops.push_pull_rows_async_inplace
            prefix = "Gradient." if route == "coo" else "SparseGradient."
            handle = start(compressed, average=True, name=prefix + self._gp_names[id(p)],
                           priority=self._gp_priority[id(p)])
            self._gp_handles[id(p)] = (p, handle, ctx)
            if self._gp_listener is not None:
                self._gp_listener(p, handle, ctx)
            return
        spec = self._gp_spec[id(p)]
        if spec is not None and (spec.is_auto or not spec.accepts(str(compressed.dtype).replace("torch.", ""))):
            spec = None  # Compression.fp16 made it float16 (it travels as such), or the planner profiles
        handle = ops.push_pull_async_inplace(compressed, average=True, name="Gradient." + self._gp_names[id(p)],
                                             priority=self._gp_priority[id(p)], compression_params=spec,
                                             lr=self._gp_group[id(p)]["lr"] if spec else None)
        self._gp_handles[id(p)] = (p, handle, ctx)
        if self._gp_listener is not None:
            self._gp_listener(p, handle, ctx)

    def _gp_start_missing(self) -> None:
        """Start the push_pulls backward did not reach: every worker must take part in each."""
        for p in self._gp_params:
            if id(p) not in self._gp_handles and not self._gp_planned(p) and id(p) not in self._gp_lowrank_ids:
                if p.grad is None:  # unused in this backward
                    p.grad = torch.zeros_like(p)
                self._gp_start(p)

    def _gp_finish(self, p: torch.Tensor, handle: int, ctx) -> None:
        """Wait for one gradient's push_pull and write the average into ``p.grad``."""
        result = self._compression.decompress(ops.synchronize(handle), ctx)
        if result.is_sparse:
            p.grad = result  # a sparse gradient's union has its own rows
        elif result is not p.grad:
            with torch.no_grad():
                p.grad.copy_(result)

    def synchronize(self) -> None:
        """Finish every gradient's push_pull (starting those backward did not reach)."""
        if self._gp_async:
            return  # async: step() pushes parameter deltas, there are no gradient push_pulls
        self._gp_start_missing()
        try:
            if self._gp_lowrank is not None:
                self._gp_reduce_low_rank()
            if self._gp_auto is not None:
                self._gp_auto.synchronize()
            for p, handle, ctx in self._gp_handles.values():
                self._gp_finish(p, handle, ctx)
            self._gp_rows.settle()
        finally:
            self._gp_handles.clear()
            for p in self._gp_params:
                self._gp_delay[id(p)] = self.backward_passes_per_step

    def _gp_reduce_low_rank(self) -> None:
        grads = {}
        for p in self._gp_params:
            if id(p) in self._gp_lowrank_ids:
                if p.grad is None:  # unused in this backward: every worker must still take part
                    p.grad = torch.zeros_like(p)
                grads[id(p)] = p.grad
        with torch.no_grad():
            self._gp_lowrank.reduce(grads)

    def state_dict(self) -> dict:
        """The wrapped optimizer's state; with powersgd / acpsgd also ``gradpress_lowrank``: the
        step count, kept factors and this worker's error buffers (each worker saves its own)."""
        sd = self._gp_base.state_dict(self)
        if getattr(self, "_gp_lowrank", None) is not None:
            sd["gradpress_lowrank"] = self._gp_lowrank.state_dict()
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        extra = state_dict.pop("gradpress_lowrank", None)
        self._gp_base.load_state_dict(self, state_dict)
        self._gp_index_groups()  # torch made new group dicts: hyper-parameters live in those now
        if extra is not None:
            if getattr(self, "_gp_lowrank", None) is None:
                raise ValueError("this state_dict holds powersgd / acpsgd state, but this optimizer has no "
                                 "low-rank compression")
            self._gp_lowrank.load_state_dict(extra)

    def _gp_index_groups(self) -> None:
        """Each parameter's group, where its learning rate is read (corrected error feedback)."""
        self._gp_group = {id(p): group for group in self.param_groups for p in group["params"]}

    @contextmanager
    def skip_synchronize(self):
        """Use after an explicit ``synchronize()``, so ``step()`` does not wait again."""
        if self._gp_async:
            raise AssertionError("skip_synchronize cannot be used in async training (BYTEPS_ENABLE_ASYNC=1)")
        self._gp_should_sync = False
        try:
            yield
        finally:
            self._gp_should_sync = True

    def step(self, closure=None):
        if self._gp_async:
            return self._gp_async_step(closure)
        if self._gp_should_sync:
            self.synchronize()
        if self._gp_auto is None:
            return self._gp_base.step(self, closure)
        start = time.perf_counter()
        loss = self._gp_base.step(self, closure)
        self._gp_auto.after_step(time.perf_counter() - start)
        return loss

    @property
    def gradpress_plan(self):
        """The compression plan in force (``compressor: auto``), or None."""
        return self._gp_auto.plan if self._gp_auto is not None else None

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
