"""``GradientPipeline``: every way a front end's tensors travel, chosen once per parameter.

Front ends (``DistributedOptimizer``, ``DistributedDataParallel``, ``CrossBarrier``,
``OneBitAdam``, ``ZeroOneAdam``) hand it each parameter's tensor of a step (a gradient or a
momentum) with ``submit`` and collect the averages with ``finish`` (or ``finish_one``). The
route of every parameter is chosen when the pipeline is built (``routes``): powersgd /
acpsgd rules -> ``lowrank``; ``auto`` rules -> ``direct`` (uncompressed) while the planner
profiles, then ``planned``; with ``bucket_bytes`` (DDP) -> ``bucket``; the rest ->
``direct``, the small 1-D ones that travel uncompressed anyway fused into ``bucket``s
(``fuse_below``), and with ``fuse_compressed`` the compressed ones too (``fusion``). A
parameter changes route only at a step boundary: when the planner applies a plan, when the
density vote finds its dense tensor mostly zero rows (-> ``rows``), or when its first sparse
COO tensor arrives (-> ``rows``: it can travel no other way).
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from ..compressors.lowrank import LowRankParams
from ..compressors.spec import CodecSpec
from ..torch.compression import Compression
from .comm import OPS, Comm
from .fusion import Fusion, crc
from .lowrank import LowRankReducer
from .planning import AutoPlanner, PlanTuning
from .routes import Route
from .routes.direct import DirectRoute
from .routes.lowrank import LowRankRoute
from .routes.rows import DensityVote, RowsRoute
from .table import ParameterTable
from .state import PipelineState

log = logging.getLogger(__name__)


def gradient_or_zeros(p: torch.Tensor) -> torch.Tensor:
    """``fill`` for gradients: what backward accumulated so far, or zeros (made ``p.grad``) for
    a parameter it did not reach: every worker must still take part in its push_pull. A
    parameter frozen since (``frozen``) sends zeros of its own and keeps no gradient."""
    if p.grad is None:
        if frozen(p):
            return torch.zeros_like(p)
        p.grad = torch.zeros_like(p)
    return p.grad


def frozen(p: torch.Tensor) -> bool:
    """A parameter trainable when wrapped, frozen since (``requires_grad_(False)``) and
    without a gradient: its average is not made its gradient, so that the optimizer leaves
    it where it is, as torch's do (momentum or weight decay would move it on zeros)."""
    return p.grad is None and not p.requires_grad


class GradientPipeline(PipelineState):
    """Averages a front end's tensors over every worker, each parameter on its route.

    Args:
        table: the parameters' names, priorities and specs (only trainable ones travel).
        prefix: tensor names are ``prefix + name`` (``"Gradient."``, as BytePS names them).
        lr_of: a parameter's current learning rate (travels with compressed pushes).
        compression: byteps.torch's ``Compression`` around each push_pull.
        views: bucketed averages come back as views of the bucket's buffer.
        bucket_bytes: fuse consecutive parameters (last first, as backward makes them) of one
            spec and dtype into buckets of up to this many bytes (DDP); None: each apart.
        fuse_below: without ``bucket_bytes``, fuse the 1-D tensors under this many bytes that
            travel uncompressed anyway (``fusion.Fusion.small``); 0: none.
        fuse_compressed: without ``bucket_bytes``, fuse the gradients a codec compresses into
            buckets of up to this many bytes (``fusion.Fusion.compressed``); 0: none.
        sparse_density: dense tensors whose non-zero row fraction is below this travel
            row-sparse from their second step (0: never; ``routes.rows``).
        fill: the tensor a parameter not submitted in a step travels with (zeros: every
            worker must take part in every push_pull).
        tuning: the planner's (``compressor: auto``).
        owner: names the front end in errors.
    Raises:
        ValueError: low-rank or ``auto`` parameters whose compression_params differ, or
            either with a tensor-level ``Compression`` other than none.
    """

    def __init__(self, table: ParameterTable, prefix: str = "Gradient.", *,
                 lr_of: Callable[[torch.Tensor], float | None] = lambda p: None, compression=Compression.none,
                 views: bool = False, bucket_bytes: float | None = None, fuse_below: int = 0, fuse_compressed: int = 0,
                 sparse_density: float = 0.0, fill: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 tuning: PlanTuning | None = None, comm: Comm = OPS, owner: str = "DistributedOptimizer"):
        self.table, self.prefix, self.comm = table, prefix, comm
        self.lr_of, self.compression, self.owner = lr_of, compression, owner
        self.fill = fill or (lambda p: torch.zeros_like(p))
        self.names = {pid: prefix + name for pid, name in table.names.items()}
        self.listener: Callable[[torch.Tensor], None] | None = None   # called as each tensor is submitted
        params = table.trainable
        lowrank, planned = table.lowrank(), table.planned()
        special = {id(p) for p in lowrank + planned}
        factored = {id(p) for p in lowrank}
        self._direct = DirectRoute([p for p in params if id(p) not in factored], self.names, table.priority,
                                   table.spec, lr_of, comm, compression)
        self._rows = RowsRoute(self.names, table.priority, comm, compression)
        self._vote = DensityVote(sparse_density, table.names, comm) if sparse_density > 0 else None
        self._route: dict[int, Route] = {id(p): self._direct for p in params}
        others = [p for p in params if id(p) not in special]
        fusion = Fusion(table, prefix, comm, lr_of, compression)
        buckets = fusion.ddp(others, bucket_bytes) if bucket_bytes is not None else \
            fusion.small(others, fuse_below) + (fusion.compressed(others, fuse_compressed) if fuse_compressed else [])
        # auto's small tensors are fused apart from the others: they leave for its plan together
        planned_buckets = fusion.small(planned, fuse_below) if bucket_bytes is None else []
        for bucket in buckets + planned_buckets:
            self._route.update({id(p): bucket for p in bucket.members})
        self.lowrank = self._lowrank_route(lowrank)
        if self.lowrank is not None:
            self._route.update({id(p): self.lowrank for p in lowrank})
        self._unplanned = dict(self._route)   # where a plan's tensors go back to
        self.planner = self._planner(planned, views, tuning, [[self.names[id(p)] for p in b.members]
                                                              for b in planned_buckets])
        self._given: set[int] = set()
        self._done: dict[int, torch.Tensor] = {}

    # ---- the route table ----------------------------------------------------------

    def route_of(self, p: torch.Tensor) -> str:
        """The kind of route ``p`` travels on now (``direct``, ``bucket``, ``rows``, ...)."""
        return self._route[id(p)].kind

    def _routes(self) -> list[Route]:
        seen: dict[int, Route] = {}
        for route in self._route.values():
            seen.setdefault(id(route), route)
        return list(seen.values())

    def _shared_spec(self, params: list[torch.Tensor], what: str, why: str) -> CodecSpec:
        """The one rule that names ``params`` (``what`` handles them together), checked: one
        spec for all, and no tensor-level Compression beside it (``why`` it needs none)."""
        specs = {str(self.table.rule[id(p)]) for p in params}
        if len(specs) > 1:
            raise ValueError(f"{self.owner}: {what} handles its tensors together: every one needs the same "
                             f"compression_params, got {sorted(specs)}")
        if self.compression is not Compression.none:
            raise ValueError(f"{self.owner}: compression_params {why}; leave compression=Compression.none")
        return self.table.rule[id(params[0])]

    def _lowrank_route(self, params: list[torch.Tensor]) -> LowRankRoute | None:
        """The route of the parameters a powersgd / acpsgd rule names (small and 1-D ones
        included: the reducer fuses those uncompressed), or None."""
        if not params:
            return None
        spec = self._shared_spec(params, "powersgd / acpsgd (a step's matrices reduced together)",
                                 "powersgd / acpsgd factor the float32 tensors themselves")
        entries = [(self.table.names[id(p)], p) for p in params]
        prefix = f"{self.prefix}{crc(self.table, params)}."
        reducer = LowRankReducer(entries, LowRankParams.parse(spec.compression_params), prefix,
                                 self.comm.settings.min_compress_bytes, comm=self.comm)
        return LowRankRoute(params, reducer)

    def _planner(self, params: list[torch.Tensor], views: bool, tuning: PlanTuning | None,
                 fused: list[list[str]]) -> AutoPlanner | None:
        """The planner of the parameters an ``auto`` rule names (with their small ones: the plan
        fuses those), or None. Until its plan exists they travel uncompressed, the small 1-D ones
        in ``fused``'s buckets (as without a codec), to which they go back if the plan is undone."""
        if not params:
            return None
        spec = self._shared_spec(params, "compressor 'auto' (one plan for every tensor it manages)",
                                 "'auto' plans each tensor's compression itself")
        devices = sorted({str(p.device) for p in params})
        if len(devices) > 1:  # its groups are fused into one buffer each, on one device
            raise ValueError(f"{self.owner}: compressor 'auto' plans one device's tensors; these are on {devices} "
                             f"(one GPU per worker process, as BytePS runs; or rules giving the others a codec)")
        return AutoPlanner(params, self.names, self.table.priority, self.lr_of, spec.compression_params,
                           self._install, leave_out=lambda p: self._route[id(p)] is self._rows, views=views,
                           tuning=tuning, comm=self.comm, matrix_names=self.table.names, fused=fused,
                           sent_dtype=self.table.sent_dtype)

    def _install(self, route: Route | None, params: list[torch.Tensor]) -> None:
        for p in params:
            self._route[id(p)] = route if route is not None else self._unplanned[id(p)]

    def adopt(self, p: torch.Tensor, name: str) -> None:
        """``p`` joins the trainable parameters at a step boundary (``ParameterTable.adopt``):
        it travels on the direct route from now on, named ``prefix + name``."""
        self.table.adopt(p, name)
        self.names[id(p)] = self.prefix + name
        self._direct.members.append(p)
        self._route[id(p)] = self._unplanned[id(p)] = self._direct

    def _to_rows(self, p: torch.Tensor, coo: bool) -> Route:
        if self._route[id(p)] is not self._direct:
            raise ValueError(f"{self.owner}: {self.table.names[id(p)]!r} has a sparse gradient, but it travels "
                             f"{self._route[id(p)].kind} with others; exempt it (compression_rules "
                             f"{{'compressor': 'none'}}) or give it a bucket of its own")
        self._rows.add(p, coo)
        self._route[id(p)] = self._rows
        return self._rows

    # ---- a step ---------------------------------------------------------------------

    def submit(self, p: torch.Tensor, tensor: torch.Tensor) -> None:
        """``p``'s tensor of this step: it starts travelling as soon as its route allows. The
        average comes back from ``finish`` (written into ``tensor``, or a new tensor)."""
        pid = id(p)
        route = self._route[pid]
        if tensor.layout == torch.sparse_coo and route is not self._rows:
            route = self._to_rows(p, coo=True)
        elif self._vote is not None and (route is self._direct or route.kind == "bucket" and route.spec is not None):
            self._vote.consider(p, tensor)  # (a compressed bucket's member: to say what fusing it costs)
        self._given.add(pid)
        if self.listener is not None:
            self.listener(p)
        if self.planner is not None and self.planner.manages(p):
            self.planner.on_submit(p)
        route.submit(p, tensor)

    def submitted(self) -> list[torch.Tensor]:
        """The parameters submitted this step (``flush`` submits the rest)."""
        return [p for p in self.table.trainable if id(p) in self._given]

    @property
    def all_submitted(self) -> bool:
        """Whether every trainable parameter has been submitted this step."""
        return len(self._given) == len(self.table.trainable)

    @property
    def any_submitted(self) -> bool:
        return bool(self._given)

    def flush(self) -> None:
        """Start everything not yet started; a parameter not submitted this step travels with
        ``fill(p)`` (zeros)."""
        if self.planner is not None:
            self.planner.on_flush()
        for p in self.table.trainable:
            if id(p) not in self._given:
                self.submit(p, self.fill(p))
        for route in self._routes():
            route.flush()

    def finish(self) -> dict[int, torch.Tensor]:
        """Flush, wait for every average, and return them by parameter id."""
        try:
            self.flush()
            results, self._done = self._done, {}
            for route in self._routes():
                results.update(route.finish())
            if self._vote is not None:
                for pid in self._vote.settle():
                    p = next(p for p in self.table.trainable if id(p) == pid)
                    if self._route[pid] is self._direct:
                        self._to_rows(p, coo=False)
                    else:  # fused by GRADPRESS_FUSE_COMPRESSED_BYTES: it stays, compressed dense
                        log.warning("%s: %r is mostly zero rows but travels fused with other compressed gradients "
                                    "(GRADPRESS_FUSE_COMPRESSED_BYTES), compressed dense; a compression rule of its "
                                    "own, {'compressor': 'none'}, would send only its rows", self.owner,
                                    self.table.names[pid])
            return results
        except BaseException:
            for route in self._routes():  # the next step starts afresh
                route.clear()
            raise
        finally:
            self._given = set()

    def finish_one(self, p: torch.Tensor) -> torch.Tensor:
        """Wait for ``p``'s average alone (its route may finish its fellow members with it)."""
        if id(p) not in self._done:
            self._done.update(self._route[id(p)].finish(p))
        return self._done.pop(id(p))

    def next_step(self) -> None:
        """Forget which parameters were submitted this step (a front end that finishes them one
        at a time with ``finish_one`` calls it once it has handed them over)."""
        self._given = set()

    def after_step(self, step_s: float) -> None:
        """The step boundary: the planner measures, plans or re-plans here."""
        if self.planner is not None:
            self.planner.after_step(step_s)
