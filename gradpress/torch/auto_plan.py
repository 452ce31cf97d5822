"""``compression_params={"compressor": "auto"}`` in DistributedOptimizer: profile, plan, apply.

1. Profiling (the first ``GRADPRESS_PLAN_STEPS`` steps): gradients travel uncompressed, one
   push_pull each, while the hooks record when each becomes ready. A gradient the optimizer
   sends row-sparse (``leave_out``: an embedding's, whose few touched rows travel exactly
   and small, ``sparse.py``) is left out of the plan: fused into a group it would travel
   dense, every row through a codec, on every worker and server. Rank 0's profile names
   the tensors planned, so every worker leaves out the same ones.
2. Planning (at a step boundary, every worker at once): a network probe (uncompressed
   push_pulls of a few sizes, timed), the codecs' costs on this host (``planner/calibrate``),
   the CPU the profiled steps' training took and who shares rank 0's host (``host.py``),
   rank 0's profile broadcast to every worker, and the same decision everywhere
   (``planner/decide``). ``GRADPRESS_PLAN_FILE`` keeps rank 0's profile for ``gradpress-plan``.
3. Planned: gradients travel in fused groups (``fusion.py``), each the way the plan says;
   with a low-rank option allowed, the matrices the plan factors are reduced together by a
   ``LowRankReducer`` once backward has ended (their error buffers are residuals too).
   After ``REFINE_STEPS`` planned steps the plan's prediction is re-based on the backward
   timeline measured under it: while the profiled steps pushed every gradient raw, that
   traffic's CPU work slowed backward down (two workers and two servers share these
   cores), so the first prediction starts from a slower backward than the plan's own.
   Every ``DRIFT_CHECK_STEPS`` steps the workers sum a drift flag; when measured iteration
   times have left the reference (the plan's median measured in its trial) by more than
   20% for several steps (the link changed),
   they re-measure the network; if the link did change, they re-plan together, and the
   residuals of groups that stop existing are handed to the next push of their members
   (the servers' through rank 0), so no gradient is lost. If it did not (the model
   mispredicts this job), the plan stays and the measured time becomes the reference.
"""
from __future__ import annotations

import dataclasses
import logging
import re
import statistics
import time
from typing import Any, Callable

import numpy as np
import torch

from .. import host
from ..compressors import auto
from ..compressors.lowrank import LowRankParams
from ..compressors.spec import CodecSpec
from ..planner import calibrate, low_rank
from ..planner.decide import Plan, decide
from ..planner.simulate import predict
from ..planner.profile import HostShare, Profile, TensorProfile, fit_link, fit_message, probe_batches
from ..server.engine import engine_count, local_engine_count
from ..trace import now_us
from . import ops
from .fusion import FusedGroup
from .lowrank import LowRankReducer

log = logging.getLogger(__name__)
PROBE_BYTES = (64 << 10, 512 << 10, 2 << 20)
PROBE_REPEATS = 3
DRIFT = 0.2                 # relative distance from the reference that counts as drift
DRIFT_STEPS = 5             # ... for this many consecutive steps
DRIFT_CHECK_STEPS = 10      # how often the workers agree on whether to re-plan
LINK_CHANGE = 0.2           # a re-measured link this far from the profile's is a changed link
TRIAL_NOISE = 0.05          # trial medians this close are told apart by the model (``choose``)
# planned steps measured before the plan is re-based on them (the first is not): a median of
# 8, as the first 2-3 steps after a switch run slow (new keys, fresh memory) on a noisy host
REFINE_STEPS = 8


class AutoPlanner:
    def __init__(self, params: list[torch.Tensor], names: dict[int, str], priority: dict[int, int],
                 lr_of: dict[int, float], compression_params: dict[str, Any],
                 leave_out: Callable[[torch.Tensor], bool] | None = None, views: bool = False):
        self.params = params
        self.views = views  # fused groups hand their averages back as views (fusion.FusedGroup)
        self.leave_out = leave_out
        self.names = names
        self.priority = priority
        self.lr_of = lr_of
        self.options = auto.options(compression_params)
        # names this planner's own push_pulls (profile, probes, drift): two planners in one job
        # (a DistributedOptimizer and a OneBitAdam, say) must not share keys
        self.label = names[id(params[0])]
        self.settings = ops.settings()
        self.plan: Plan | None = None
        self.version = 0
        self.groups: list[FusedGroup] = []
        self.group_of: dict[int, FusedGroup] = {}
        self.carry: dict[int, torch.Tensor] = {}
        self.factored: list[torch.Tensor] = []      # the plan's matrices sent as low-rank factors
        self.reducer: LowRankReducer | None = None
        self.profile: Profile | None = None
        self._steps = 0
        self._iter_start = time.perf_counter()
        self._backward_end = 0.0
        self._ready: dict[int, list[float]] = {id(p): [] for p in params}
        self._timeline: list[tuple[float, float]] = []   # (backward end, step) per profiled step
        self._planned_ready: dict[int, list[float]] = {id(p): [] for p in params}
        self._planned_timeline: list[tuple[float, float]] = []
        self._planned_factors: list[tuple[float, float]] = []  # (factor work, reconstruction) s per step
        self.refined = False       # the plan has been re-based on the timeline measured under it
        self._trials: list[tuple[Plan, Profile, float]] = []  # plans measured so far (re-based, median s)
        self._pending: list[Plan] = []                          # the plans of the trial not yet run
        # the last trial: each plan, its measured median s, its modelled s (``choose``)
        self.measured_plans: list[tuple[Plan, float, float]] = []
        self._measured: list[float] = []
        self._last_broadcast = ""  # the name of this planner's latest broadcast
        self._training_cpu: host.TrainingCpu | None = None
        # (training, sockets) CPU read at the end of each step measured (host.TrainingCpu)
        self._cpu_marks: list[tuple[float, float]] = []

    # ---- called by the optimizer ------------------------------------------------

    def manages(self, p: torch.Tensor) -> bool:
        return id(p) in self._ready

    def on_ready(self, p: torch.Tensor) -> bool:
        """A hook: ``p`` has its gradient. True when the plan sends it (else the caller does, raw)."""
        if self.plan is None:
            self._ready[id(p)].append(time.perf_counter() - self._iter_start)
            return False
        if not self.refined:  # the timeline the re-basing reads; once settled, nothing reads it
            self._planned_ready[id(p)].append(time.perf_counter() - self._iter_start)
        group = self.group_of.get(id(p))
        if group is None:  # factored: reduced with the plan's other matrices in synchronize()
            return True
        if group.mark_ready(p):
            group.start(self.carry)
        return True

    def synchronize(self) -> None:
        self._backward_end = time.perf_counter() - self._iter_start
        for group in self.groups:
            if group.handle is None:
                group.start(self.carry)
        if self.reducer is not None:
            grads = {}
            with torch.no_grad():
                for p in self.factored:
                    if p.grad is None:  # unused in this backward: every worker must still take part
                        p.grad = torch.zeros_like(p)
                    extra = self.carry.pop(id(p), None)
                    if extra is not None:
                        p.grad.add_(extra.view_as(p.grad))
                    grads[id(p)] = p.grad
                self.reducer.reduce(grads)
        for group in self.groups:
            group.finish()

    def after_step(self, step_s: float) -> None:
        """At the end of every step: profile, plan, or watch for drift."""
        self._steps += 1
        elapsed = time.perf_counter() - self._iter_start
        if not self.params:  # every gradient travels row-sparse: nothing to plan or watch
            return
        if self.plan is None:
            self._mark_cpu()
            if self._steps > 1:  # the first step compiles, allocates and declares
                self._timeline.append((self._backward_end, step_s))
            if self._steps >= max(2, self.settings.plan_steps):
                self._make_plan()
        else:
            # kept only as far back as the re-basing and the drift check read (a long job
            # would otherwise grow them by a step's entries every step)
            self._measured = self._measured[-max(REFINE_STEPS, DRIFT_STEPS):] + [elapsed]
            if not self.refined:
                self._mark_cpu()
                self._planned_timeline.append((self._backward_end, step_s))
                if self.reducer is not None:
                    self._planned_factors.append((self.reducer.work_s, self.reducer.rebuild_s))
                if len(self._planned_timeline) > REFINE_STEPS:
                    self._refine()
            # drift: not while plans are being measured (their own times are not yet the reference)
            elif self._steps % DRIFT_CHECK_STEPS == 0 and self._drift_agreed():
                self._replan()
        self._iter_start = time.perf_counter()

    def _mark_cpu(self) -> None:
        if not host.TrainingCpu.available():  # (then no host share: the model has no CPU bound)
            return
        if self._training_cpu is None:
            self._training_cpu = host.TrainingCpu(ops.client().comm)
        self._cpu_marks.append(self._training_cpu.read())

    def _train_cpu_s(self) -> float:
        """Training CPU per step: the median over the steps marked, the first left out (as the
        timelines: after a switch 2-3 steps run slow, and a trial's mean of 8 came out 0.21
        CPU s where its median, and the steps after it, were 0.16-0.18)."""
        marks = self._cpu_marks
        return statistics.median(b[0] - a[0] for a, b in zip(marks, marks[1:])) if len(marks) > 1 else 0.0

    def _wire_s_per_byte(self) -> float:
        """What a byte sent or received costs this worker's sockets (ZeroMQ's threads: TCP,
        CURVE), over the profiled steps: every managed gradient pushed and pulled raw."""
        marks = self._cpu_marks
        moved = 2 * sum(p.numel() * p.element_size() for p in self.params)
        if len(marks) < 2 or moved == 0:
            return 0.0
        return max(marks[-1][1] - marks[0][1], 0.0) / (len(marks) - 1) / moved

    def _host_share(self) -> HostShare | None:
        """Who shares rank 0's CPUs (the address book's machine ids), its training's CPU and
        its sockets' CPU per byte."""
        mine = host.machine_id()
        if not mine or len(self._cpu_marks) < 2:  # who shares it, or its training's CPU, unknown
            return None
        nodes = ops.client().book.sharing(mine)
        workers = sum(n.role == "worker" for n in nodes)
        servers = sum(n.role == "server" for n in nodes)
        return HostShare(host.cores(), max(workers, 1), servers, max(self._train_cpu_s(), 0.0),
                         self._wire_s_per_byte())

    def _server_lanes(self) -> int:
        """Threads doing a server's sums, as the simulator counts them: its engine threads, or
        1 for the I/O thread where it has none. A server on rank 0's machine shares its cores
        and follows the same rule as it (engine_count); one elsewhere is taken to have cores
        enough for the default (its cores are not in the address book)."""
        book, mine = ops.client().book, host.machine_id()
        setting = self.settings.server_engine_threads
        threads = [local_engine_count(setting, book) if mine and n.machine == mine
                   else engine_count(setting, float("inf"), 1) for n in book.servers]
        return max(min(threads, default=1), 1)

    # ---- planning ---------------------------------------------------------------------

    def _make_plan(self) -> None:
        round_trips, batches = self._probe()
        planned = [p for p in self.params if self.leave_out is None or not self.leave_out(p)]
        text = None
        if ops.rank() == 0:  # "": nothing left to plan
            text = self._profile_json(round_trips, batches, planned) if planned else ""
        text = self._broadcast(text, "PlanProfile")
        if not text:
            self._keep_planned(set())
            log.info("gradpress: every gradient the planner was given travels row-sparse; nothing to plan")
            return
        self.profile = Profile.from_json(text, "rank 0's profile")
        self._keep_planned({t.name for t in self.profile.tensors})
        self._start(decide(self.profile, list(self.options), self.settings.min_compress_bytes))

    def _profile_json(self, round_trips, batches, planned: list[torch.Tensor]) -> str:
        """Rank 0's profile of ``planned`` (saved to ``GRADPRESS_PLAN_FILE`` too), as JSON."""
        costs = calibrate.codec_costs(self.options)
        message_s = fit_message(batches)
        link = fit_link(round_trips, ops.size(), costs["none"].add, message_s)
        s = self.settings
        profile = Profile(ops.size(), len(ops.client().book.servers), self._tensors(self._ready, planned),
                          statistics.median(b for b, _ in self._timeline),
                          statistics.median(t for _, t in self._timeline), costs, link, message_s,
                          s.partition_bytes, s.scheduling_credit, self._server_lanes(),
                          notes={"profiled_steps": len(self._timeline), "round_trips": round_trips,
                                 "batches": batches}, host=self._host_share())
        text = profile.to_json()
        if s.plan_file:
            with open(s.plan_file, "w") as fh:
                fh.write(text)
        return text

    def _keep_planned(self, planned: set[str]) -> None:
        """Manage only the tensors rank 0's profile names; the rest go back to the optimizer."""
        left = [p for p in self.params if self.names[id(p)] not in planned]
        if left:
            log.info("gradpress: left out of the plan (they travel row-sparse): %s",
                     ", ".join(self.names[id(p)] for p in left))
        self.params = [p for p in self.params if self.names[id(p)] in planned]
        for p in left:
            del self._ready[id(p)], self._planned_ready[id(p)]

    def _start(self, plan: Plan) -> None:
        """Apply a decision's alternatives one by one, to be measured, and the decision last:
        the job usually keeps it, and then runs on without one more switch (a switch costs a
        step of hand-over and 2-3 slow steps while the new keys' memory is set up)."""
        trials = [*plan.alternatives, dataclasses.replace(plan, alternatives=())]
        self._trials, self._pending = [], trials[1:]
        self._apply(trials[0])

    def _tensors(self, ready: dict[int, list[float]], params: list[torch.Tensor]) -> tuple[TensorProfile, ...]:
        """``params`` in the order their gradients became ready (median times in ``ready``: a
        pause between two steps, an evaluation say, is one step's outlier)."""
        typical = {id(p): statistics.median(ready[id(p)] or [0.0]) for p in params}
        order = sorted(params, key=lambda p: (typical[id(p)], -self.priority[id(p)]))
        return tuple(TensorProfile(self.names[id(p)], 4 * p.numel(), typical[id(p)], self.priority[id(p)],
                                   p.shape[0] if p.dim() >= 2 and p.shape[0] > 0 else 1) for p in order)

    def _refine(self) -> None:
        """Re-base the plan's prediction on rank 0's backward timeline measured under it (its
        first planned step left out: it declared the groups' keys) and its training's CPU,
        with rank 0's measured iteration time. The plan is not decided again on that
        timeline: a plan whose codecs cost more CPU would slow the backward it was decided on
        (the model bounds an iteration by a shared host's CPU, but does not see how the
        communication thread and the servers slow the training thread), and the plans would
        alternate. Instead the decision's alternatives (``Plan.alternatives``)
        and the decision itself run in turn (``_start``), each for as many steps and measured
        the same way, and the job keeps the one ``choose`` picks from rank 0's measurements
        (every worker reads the same broadcast medians)."""
        text = None
        if ops.rank() == 0:
            ready = {pid: times[1:] for pid, times in self._planned_ready.items()}
            timeline = self._planned_timeline[1:]
            # the decision's order kept: the plans' groups index it
            by_name = {self.names[id(p)]: id(p) for p in self.params}
            tensors = tuple(dataclasses.replace(t, ready_s=statistics.median(ready[by_name[t.name]] or [0.0]))
                            for t in self.profile.tensors)
            profile = dataclasses.replace(self.profile, tensors=tensors,
                                          backward_end_s=statistics.median(b for b, _ in timeline),
                                          step_s=statistics.median(t for _, t in timeline),
                                          notes=dict(self.profile.notes, refined_steps=len(timeline),
                                                     measured_s=statistics.median(self._measured[1:])))
            plan_cpu_s = 0.0  # the plan's own work on the training thread (factors)
            if self.plan.low_rank and len(self._planned_factors) > 1:  # (the first also seeds Q)
                factors = self._planned_factors[1:]
                work_s, rebuild_s = (statistics.median(w for w, _ in factors), statistics.median(r for _, r in factors))
                profile = low_rank.measured(profile, self.plan.low_rank_option, self.plan.low_rank, work_s, rebuild_s)
                plan_cpu_s = work_s + rebuild_s
            if profile.host is not None:
                profile = dataclasses.replace(profile, host=dataclasses.replace(
                    profile.host, train_cpu_s=max(self._train_cpu_s() - plan_cpu_s, 0.0)))
            text = profile.to_json()
        text = self._broadcast(text, "PlanRefined")
        profile = Profile.from_json(text, "rank 0's refined profile")
        predicted = predict(*self.plan.simulated(profile))
        measured = float(profile.notes["measured_s"])
        log.info("gradpress: plan %d re-based on the backward measured under it (%.1f ms, profiled %.1f ms): "
                 "predicted %.1f ms (was %.1f ms), measured %.1f ms", self.version, 1e3 * profile.backward_end_s,
                 1e3 * self.profile.backward_end_s, 1e3 * predicted, 1e3 * self.plan.predicted_s, 1e3 * measured)
        self.profile = profile
        self._trials.append((dataclasses.replace(self.plan, predicted_s=predicted), profile, measured))
        if self._pending:  # measure the next alternative
            self._switch(self._pending.pop(0))
            return
        best, modelled = choose(self._trials)
        plan, kept, kept_s = self._trials[best]
        # each trial's profile starts from the one before, so the last one carries every
        # cost the trial measured (a low-rank option's factor work): a re-plan decides on them
        latest = self._trials[-1][1]
        self.profile = dataclasses.replace(kept, codecs=latest.codecs, notes={**latest.notes, **kept.notes})
        if len(self._trials) > 1:
            log.info("gradpress: plans measured (ms, and as modelled on common ground): %s; keeping %s",
                     "; ".join(f"{p.summary()}: {1e3 * m:.1f} ({1e3 * t:.1f})"
                               for (p, _, m), t in zip(self._trials, modelled)), plan.summary())
        if best != len(self._trials) - 1:
            self._switch(plan)
        else:  # (a switch releases them too)
            self._release_leftovers()
        self.measured_plans = [(p, m, t) for (p, _, m), t in zip(self._trials, modelled)]
        self._trials = []
        self.refined = True
        self.plan = dataclasses.replace(plan, refined=True)
        # drift is measured against the time measured under the plan, not the prediction: a
        # model that mispredicts this job by 20% would re-measure the link for nothing. (The
        # measured times stay: a link that changed meanwhile is still seen as drift.)
        self._reference_s = kept_s

    def _switch(self, plan: Plan) -> None:
        """Apply another plan at this step boundary; the residuals go to its first pushes."""
        self.version += 1
        self._hand_over_residuals()
        self._release_plan()
        self._apply(plan)

    def _release_plan(self) -> None:
        """Forget the plan being left: its groups' and factors' keys, here and (rank 0 tells
        them) on the servers, which would otherwise keep every plan's sums and residuals.
        Called after a collective at this step boundary (a broadcast), so every worker has
        pulled its last round of them."""
        client = ops.client()
        names = [group.name for group in self.groups]
        if self.reducer is not None:
            factors = re.compile(re.escape(self.reducer.prefix) + r"LowRank\.(P|Q|raw|full\..+)")
            names += [n for n in client.tensors if factors.fullmatch(n)]
        self._release_leftovers(names)

    def _release_leftovers(self, also: list[str] = ()) -> None:
        """Forget the link probes' keys, the broadcasts' before the last one (and ``also``),
        after a collective as above: every worker is through those broadcasts, since it
        pushed into the last one after them."""
        client = ops.client()
        # exactly this planner's (another planner's label may start with this one's)
        probe = re.compile(re.escape(f"PlanProbe.{self.label}.") + r"\d+\.(batch)?\d+\.\d+")
        sent = re.compile(r"Object\.Plan(Profile|Refined)\." + re.escape(f"{self.label}.") + r"\d+\.\d+\.(length|data)")
        last = f"Object.{self._last_broadcast}."
        names = list(also) + [n for n in client.tensors if probe.fullmatch(n)
                              or (sent.fullmatch(n) and not n.startswith(last))]
        client.release(names, servers=ops.rank() == 0)

    def _broadcast(self, text: str | None, kind: str) -> str:
        """Rank 0's ``text`` on every worker (this planner's keys: ``_release_leftovers`` frees them)."""
        from .broadcast import broadcast_object
        self._last_broadcast = f"{kind}.{self.label}.{self.version}"
        return broadcast_object(text, root_rank=0, name=self._last_broadcast)

    def _probe(self) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
        """Median times of uncompressed push_pulls, every worker at once: one partition of a
        few sizes (round trips), and batches of tiny ones in flight together (messages)."""
        round_trips, batches = [], []
        for nbytes in PROBE_BYTES:
            nbytes = min(nbytes, self.settings.partition_bytes)
            tensors = [torch.zeros(nbytes // 4)]
            round_trips.append((nbytes, self._timed(tensors, f"PlanProbe.{self.label}.{self.version}.{nbytes}")))
        for k in probe_batches(self.settings.scheduling_credit):
            tensors = [torch.zeros(64) for _ in range(k)]
            batches.append((k, self._timed(tensors, f"PlanProbe.{self.label}.{self.version}.batch{k}")))
        return round_trips, batches

    @staticmethod
    def _timed(tensors: list[torch.Tensor], name: str) -> float:
        times = []
        for r in range(PROBE_REPEATS + 1):
            t = time.perf_counter()
            handles = [ops.push_pull_async_inplace(x, average=False, name=f"{name}.{i}") for i, x in enumerate(tensors)]
            for h in handles:
                ops.synchronize(h)
            if r:  # the first declares the keys and sets the servers up
                times.append(time.perf_counter() - t)
        return statistics.median(times)

    def _apply(self, plan: Plan) -> None:
        by_name = {self.names[id(p)]: p for p in self.params}
        groups = []
        for g, (members, option) in enumerate(zip(plan.groups, plan.options)):
            params = [by_name[self.profile.tensors[i].name] for i in members]
            spec = None if option == "none" else CodecSpec.from_params(self.options[option])
            name = f"Plan{self.version}.{g}.{self.names[id(params[0])]}"
            groups.append(FusedGroup(name, params, spec, max(self.priority[id(p)] for p in params), self.lr_of,
                                     views=self.views))
        self.plan, self.groups = plan, groups
        self.group_of = {id(p): grp for grp in groups for p in grp.members}
        self.factored = [by_name[self.profile.tensors[i].name] for i in plan.low_rank]
        self.reducer = None
        if self.factored:
            params = LowRankParams.parse(self.options[plan.low_rank_option])
            lowest = min(self.priority.values()) - 1
            self.reducer = LowRankReducer([(self.names[id(p)], p) for p in self.factored], params,
                                          f"Plan{self.version}.{self.label}.", self.settings.min_compress_bytes,
                                          lowest)
        self._measured = []
        self._planned_ready = {pid: [] for pid in self._planned_ready}
        self._planned_timeline = []
        self._planned_factors = []
        self._cpu_marks = []
        self._reference_s = plan.predicted_s  # what drift is measured against
        log.info("gradpress plan %d (rank %d):\n%s", self.version, ops.rank(), plan.table(self.profile))
        tracer = ops.client().tracer
        now = now_us()
        tracer.add(f"plan {self.version}: {len(groups)} groups, {len(self.factored)} matrices as factors, "
                   f"predicted {1e3 * plan.predicted_s:.1f} ms", now, now,
                   key=-1, round=self._steps)

    def _drift_agreed(self) -> bool:
        recent = self._measured[-DRIFT_STEPS:]
        drifted = len(recent) == DRIFT_STEPS and all(abs(t / self._reference_s - 1) > DRIFT for t in recent)
        flag = torch.tensor([1.0 if drifted else 0.0])
        ops.push_pull_inplace(flag, average=False, name=f"PlanDrift.{self.label}")
        return float(flag[0]) > 0

    def _replan(self) -> None:
        recent = [round(1e3 * t, 1) for t in self._measured[-DRIFT_STEPS:]]
        self.version += 1
        round_trips, _ = self._probe()
        text = None
        if ops.rank() == 0:
            link = fit_link(round_trips, ops.size(), self.profile.codecs["none"].add, self.profile.message_s)
            old = self.profile.link.bytes_per_s
            changed = abs(link.bytes_per_s / old - 1) > LINK_CHANGE
            text = self.profile.scaled(bytes_per_s=link.bytes_per_s).to_json() if changed else ""
        text = self._broadcast(text, "PlanProfile")
        if not text:  # the link is as profiled: the model, not the network, is off
            log.info("gradpress: iterations (%s ms) are off the prediction, but the link is as profiled; "
                     "keeping plan %d", recent, self.version - 1)
            self._reference_s = statistics.median(self._measured[-DRIFT_STEPS:])
            self._measured = []
            self._release_leftovers()
            return
        log.info("gradpress: the link changed (iterations %s ms, %.1f ms predicted); re-planning", recent,
                 1e3 * self.plan.predicted_s)
        self._hand_over_residuals()
        self._release_plan()
        self.profile = Profile.from_json(text, "rank 0's profile")
        self._start(decide(self.profile, list(self.options), self.settings.min_compress_bytes))
        self.refined = False  # re-based (and its alternatives tried) again

    def _hand_over_residuals(self) -> None:
        """Each compressed group's error feedback goes into its members' next push."""
        self.carry = self.residuals()

    def residuals(self) -> dict[int, torch.Tensor]:
        """The plan's error feedback, by member (id -> flat tensor): this worker's residuals,
        and on rank 0 the servers' too (so that they join the sum once), plus what is still
        carried from an earlier plan."""
        client = ops.client()
        out = {pid: part.clone() for pid, part in self.carry.items()}
        for group in self.groups:
            if group.spec is None:
                continue
            parts = client.tensor(group.name).parts
            flat = _flat_residual(client.compressor_state(group.name), parts)
            if ops.rank() == 0:
                server = client.server_state(group.name)
                flat += _flat_residual({"residuals": {i: r for i, (r, _) in server.items() if r is not None}}, parts)
            for pid, part in group.flat_to_members(torch.from_numpy(flat)).items():
                out[pid] = out[pid] + part if pid in out else part
        # a factored matrix's error buffer is this worker's only residual (servers sum factors exactly)
        for pid, error in (self.reducer.errors() if self.reducer is not None else {}).items():
            out[pid] = out[pid] + error if pid in out else error
        return out


def choose(trials: list[tuple[Plan, Profile, float]]) -> tuple[int, list[float]]:
    """Which measured plan to keep, and each one's modelled time: (plan, its re-based profile,
    its measured median s) per plan. The fastest measured, unless others measured within
    ``TRIAL_NOISE`` of it: then, of those, the one the model puts fastest. The model runs
    each plan on its own measured timeline but on one training CPU for all (the median of
    theirs: training's CPU does not depend on the plan, and its noise would otherwise decide).
    On this 2-core host a trial's medians of 8 steps moved 5-10% between two measurements
    of one plan; the codecs' CPU, which the model sees, told the MLP's randomk and onebit
    apart where their trials could not (gp_randomk ran 5-10% faster as a system)."""
    fastest = min(m for _, _, m in trials)
    trains = [p.host.train_cpu_s for _, p, _ in trials if p.host is not None]
    train = statistics.median(trains) if trains else 0.0
    modelled = []
    for plan, profile, _ in trials:
        if profile.host is not None:
            profile = dataclasses.replace(profile, host=dataclasses.replace(profile.host, train_cpu_s=train))
        modelled.append(predict(*plan.simulated(profile)))
    near = [i for i, (_, _, m) in enumerate(trials) if m <= fastest * (1 + TRIAL_NOISE)]
    return min(near, key=lambda i: (modelled[i], trials[i][2], i)), modelled


def _flat_residual(state: dict | None, parts: list[int]) -> np.ndarray:
    """An error-feedback state's residuals laid out like the tensor (zeros where a partition has none)."""
    residuals = (state or {}).get("residuals") or {}
    return np.concatenate([np.asarray(residuals[i], np.float32) if i in residuals else np.zeros(n, np.float32)
                           for i, n in enumerate(parts)])
