"""``DistributedOptimizer``: push_pull each gradient as soon as backward produces it.

A hook on every parameter hands its gradient to the optimizer's ``GradientPipeline`` the
moment it has been accumulated (``backward_passes_per_step`` times), so communication
overlaps the rest of backward; ``step()`` waits for every average, puts it in ``.grad`` and
steps the wrapped optimizer. Parameters earlier in the model get higher priority: the next
forward pass needs them first. How each gradient travels (its codec, row-sparse, low-rank,
the planner's) is the pipeline's choice (``gradpress.pipeline``).

Async mode (BYTEPS_ENABLE_ASYNC=1), as in BytePS: the servers hold the parameters,
initialised from rank 0 when the optimizer is built; ``step()`` steps locally, pushes the
change it made to each parameter and pulls the servers' current parameters.
"""
from __future__ import annotations

import inspect
import threading
import time
import warnings
from contextlib import contextmanager

import torch

from ..compressors.policy import CompressionPolicy
from ..pipeline import GradientPipeline, ParameterTable, frozen, gradient_or_zeros
from ..pipeline.async_params import AsyncParameters
from ..pipeline.planning import PlanTuning
from . import ops
from .compression import Compression, check_compression
from .folded_momentum import FoldedMomentum
from .key_layouts import KeyLayouts

_taken = KeyLayouts()  # each parameter name this job's DistributedOptimizers gave a key: (elements, dtype)


def _check_names_free(table: ParameterTable) -> None:
    """Refuse, as it is built, an optimizer whose parameter names an earlier one of this job
    gave keys of another size or dtype (a GAN's two models, ``nn.Sequential``s both, so
    ``0.weight`` in each): its first step stopped with a TensorMismatchError on a key the user
    never named. Keys stay BytePS's, ``Gradient.<name>``: an optimizer built again over the same
    names (a fresh one to load a checkpoint into) takes the same keys, as its checkpoint's
    plan names them."""
    layouts = {table.names[id(p)]: (p.numel(), p.dtype) for p in table.params  # (frozen ones unnamed never travel)
               if p.requires_grad or id(p) in table.given}
    clash = sorted(n for n, layout in layouts.items() if not _taken.claim(n, layout))
    if clash:
        raise ValueError(f"DistributedOptimizer: parameter name(s) {clash[:4]} are another DistributedOptimizer's "
                         f"of this job, of other sizes (two models whose parameters are named alike, as a GAN's "
                         f"two nn.Sequential): name each model's apart, e.g. "
                         f"named_parameters=D.named_parameters(prefix='D')")


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods ``DistributedOptimizer`` puts in front of the wrapped optimizer's class."""

    def __init__(self, optimizer, named_parameters, compression, backward_passes_per_step,
                 compression_params=None, compression_rules=None, plan_tuning=None):
        # the wrapped class's own constructor, with the hyper-parameters the user gave it: its
        # defaults fill a param group added later, and an optimizer whose constructor needs
        # them (a custom one's lr) is built at all
        super().__init__(optimizer.param_groups, **constructor_args(type(optimizer), optimizer.defaults))
        self.state.update(optimizer.state)  # a checkpoint loaded before wrapping stays loaded
        self.backward_passes_per_step = backward_passes_per_step
        self._index_groups()
        self._folded: FoldedMomentum | None = None
        settings = ops.settings()
        all_params = [p for group in self.param_groups for p in group["params"]]
        if settings.enable_async:
            if compression_params or compression_rules:
                raise ValueError("BYTEPS_ENABLE_ASYNC=1: asynchronous training pushes uncompressed parameter "
                                 "deltas; drop compression_params / compression_rules")
            if compression is not Compression.none:  # BytePS pushes the deltas uncompressed too
                warnings.warn("BYTEPS_ENABLE_ASYNC=1: compression is ignored, as in BytePS: parameter "
                              "deltas travel uncompressed", stacklevel=3)
            self._gradpress = AsyncParameters(ParameterTable(all_params, named_parameters))
            self._known = {id(p) for p in self._gradpress.table.trainable}
            return
        table = ParameterTable(all_params, named_parameters,
                               CompressionPolicy.for_job(settings, compression_params, compression_rules))
        self._folded = FoldedMomentum(table, compression, route_of=lambda q: self._gradpress.route_of(q))
        self._folded.fold(self.param_groups, table.trainable)
        _check_names_free(table)
        self._gradpress = GradientPipeline(table, "Gradient.", lr_of=lambda p: self._groups[id(p)]["lr"],
                                           compression=compression, views=True,
                                           fuse_below=settings.fuse_below_bytes,
                                           fuse_compressed=settings.fuse_compressed_bytes,
                                           sparse_density=settings.sparse_density, fill=gradient_or_zeros,
                                           tuning=plan_tuning)
        self._known = {id(p) for p in table.trainable}
        self._passes_left = {id(p): backward_passes_per_step for p in table.trainable}
        self._should_sync = True
        self._synchronized = False  # synchronize() ran since the last gradient or step()
        self._submitting = threading.Lock()  # a model over several GPUs: a hook thread per device
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_gradient) for p in table.trainable]
        for p in table.trainable:
            ops.declare("Gradient." + table.names[id(p)])

    @property
    def _async(self) -> bool:
        return isinstance(self._gradpress, AsyncParameters)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Accumulate ``passes`` backward passes locally before each push_pull, from now on
        (BytePS's method; a count already under way starts again)."""
        if passes < 1:
            raise ValueError(f"set_backward_passes_per_step({passes}): must be at least 1")
        self.backward_passes_per_step = passes
        self._reset_passes()

    def _reset_passes(self) -> None:
        for key in self._passes_left:
            self._passes_left[key] = self.backward_passes_per_step

    def _on_gradient(self, p: torch.Tensor) -> None:
        with self._submitting:  # one hook thread at a time: a bucket or a vote is filled by one
            left = self._passes_left[id(p)]
            if left <= 0:
                raise AssertionError("gradients were computed more than backward_passes_per_step times "
                                     "before step(); raise backward_passes_per_step to accumulate locally")
            self._passes_left[id(p)] = left - 1
            self._synchronized = False
            if left == 1:
                self._gradpress.submit(p, p.grad)

    def synchronize(self) -> None:
        """Finish every gradient's push_pull (starting those backward did not reach)."""
        if self._async:
            return  # async: step() pushes parameter deltas, there are no gradient push_pulls
        try:
            self._adopt_late()
            self._land(self._gradpress.finish())
            self._synchronized = True
        finally:
            self._reset_passes()

    def _late(self) -> list[tuple[str, torch.Tensor]]:
        """(name, parameter) of each parameter that became trainable after the optimizer was
        built: unfrozen, or in a param group added since."""
        table, known = self._gradpress.table, self._known
        return [(table.names.get(id(p)) or table.given.get(id(p)) or f"param_group{g}.{i}", p)
                for g, group in enumerate(self.param_groups) for i, p in enumerate(group["params"])
                if p.requires_grad and id(p) not in known]

    def _adopt_late(self) -> list[tuple[str, torch.Tensor]]:
        """Late parameters (``_late``) join at this step boundary: this step's gradient (or
        change, in async mode) travels with the rest, later ones as backward makes them.
        (BytePS and torch's DDP leave them out: each worker steps on its own gradient and the
        models drift apart.) Every worker adopts them at the same step, as each unfreezes
        them at the same step. Returns the (name, parameter) adopted."""
        late = self._late()
        for name, p in late:
            self._gradpress.adopt(p, name)
            self._known.add(id(p))
            if not self._async:
                self._passes_left[id(p)] = self.backward_passes_per_step
                self._hooks.append(p.register_post_accumulate_grad_hook(self._on_gradient))
                ops.declare("Gradient." + name)
        if late:
            self._index_groups()
            if self._folded is not None:
                self._folded.fold(self.param_groups, [p for _, p in late])
            warnings.warn(f"DistributedOptimizer: {', '.join(n for n, _ in late)} became trainable after the "
                          f"optimizer was built; averaged from this step on (uncompressed where a low-rank or "
                          f"'auto' rule names them)", stacklevel=4)
        return late

    def _land(self, results: dict[int, torch.Tensor]) -> None:
        """Each average becomes its parameter's gradient (when it is not already: a sparse
        union, a view of a bucket's buffer, an fp16 round trip's widened copy)."""
        for p in self._gradpress.table.trainable:
            out = results.get(id(p))
            if out is not None and out is not p.grad and not frozen(p):
                p.grad = out

    def state_dict(self) -> dict:
        """The wrapped optimizer's state; with powersgd / acpsgd also ``gradpress_lowrank``: the
        step count, kept factors and this worker's error buffers (each worker saves its own);
        and ``gradpress_compression``: the codecs' state, this worker's residuals and momenta
        and the servers' residuals (fetched from them), and ``auto``'s plan with its own."""
        sd = super().state_dict()
        pipeline = getattr(self, "_gradpress", None)
        if isinstance(pipeline, GradientPipeline):
            state = pipeline.state_dict(residuals=True)
            if state["lowrank"] is not None:
                sd["gradpress_lowrank"] = state["lowrank"]
            sd["gradpress_compression"] = {k: v for k, v in state.items() if k != "lowrank"}
        if getattr(self, "_folded", None) is not None:
            self._folded.save(sd)
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        extra = state_dict.pop("gradpress_lowrank", None)
        codecs = state_dict.pop("gradpress_compression", None)  # (absent from checkpoints of before)
        folded = state_dict.pop("gradpress_folded_momentum", None) or {}  # (async: unused, as the codecs')
        if self._folded is not None:
            self._folded.check_loadable(folded)  # before anything is loaded
        super().load_state_dict(state_dict)
        self._index_groups()  # torch made new group dicts: hyper-parameters live in those now
        if extra is not None and (self._async or self._gradpress.lowrank is None):
            raise ValueError("this state_dict holds powersgd / acpsgd state, but this optimizer has no "
                             "low-rank compression")
        if self._folded is not None:
            self._folded.load_state_dict(folded, self.param_groups)
        if (extra is not None or codecs is not None) and not self._async:
            self._gradpress.load_state_dict({"lowrank": extra, **(codecs or {})})

    def _index_groups(self) -> None:
        """Each parameter's group, where its learning rate is read (corrected error feedback)."""
        self._groups = {id(p): group for group in self.param_groups for p in group["params"]}

    @contextmanager
    def skip_synchronize(self):
        """Use after an explicit ``synchronize()``, so ``step()`` does not wait again."""
        if self._async:
            raise AssertionError("skip_synchronize cannot be used in async training (BYTEPS_ENABLE_ASYNC=1)")
        self._should_sync = False
        try:
            yield
        finally:
            self._should_sync = True

    def step(self, closure=None):
        if self._async:
            self._adopt_late()
            return self._gradpress.step(lambda: super(_DistributedOptimizer, self).step(closure))
        if self._should_sync:
            if self._synchronized:  # (Horovod warns too; BytePS pushes again without a word)
                warnings.warn("DistributedOptimizer: step() after synchronize() without skip_synchronize() "
                              "push_pulls every gradient again, averaging (and compressing) the averages a "
                              "second time; call step() inside `with optimizer.skip_synchronize():`", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        start = time.perf_counter()
        self._folded.keep_folded(self.param_groups)
        with self._folded.applied(self):
            loss = super().step(closure)
        self._gradpress.after_step(time.perf_counter() - start)
        return loss

    @property
    def gradpress_plan(self):
        """The compression plan in force (``compressor: auto``), or None."""
        planner = None if self._async else self._gradpress.planner
        return planner.plan if planner is not None else None

    def zero_grad(self, *args, **kwargs):  # the wrapped class's own arguments and defaults
        if not self._async and self._gradpress.any_submitted:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize()")
        return super().zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                         compression=Compression.none, backward_passes_per_step: int = 1,
                         staleness: int = 0, compression_params: dict | None = None,
                         compression_rules: list[tuple[str, dict]] | None = None,
                         plan_tuning: PlanTuning | None = None):
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
        plan_tuning: the planner's constants (``compressor: auto``; gradpress's own).
    """
    check_compression(compression, compression_params, "DistributedOptimizer")
    if staleness != 0:
        raise ValueError(f"staleness={staleness}: only synchronous training (staleness=0) is supported")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step={backward_passes_per_step}: must be at least 1")
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("DistributedOptimizer: this optimizer is a DistributedOptimizer already; wrapping it "
                         "again would average every gradient twice")
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    return cls(optimizer, named_parameters, compression, backward_passes_per_step,
               compression_params, compression_rules, plan_tuning)


def constructor_args(optimizer_class: type, defaults: dict) -> dict:
    """The entries of ``defaults`` that ``optimizer_class``'s constructor takes by name."""
    try:
        named = inspect.signature(optimizer_class.__init__).parameters
    except (TypeError, ValueError):  # no signature to read: the constructor's own defaults
        return {}
    return {k: v for k, v in defaults.items() if k in named and k != "params"
            and named[k].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
