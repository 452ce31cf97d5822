"""``AutoPlanner``: the lifecycle of ``compressor: auto`` (``PlanStage``).

1. ``PROFILING`` (the first ``GRADPRESS_PLAN_STEPS`` steps): the planned tensors travel
   uncompressed as the pipeline sends them (its small ones fused) while the ``StepClock``
   records when each is ready. Row-sparse ones (``leave_out``) are left out; rank 0's
   profile names those planned, so every worker leaves out the same ones.
2. ``TRIALS``: at a step boundary, every worker at once: a link probe, the codecs' costs on
   this host, rank 0's profile broadcast, the same decision everywhere (``planner.decide``).
   The decision's alternatives, then the decision itself, run in turn for ``refine_steps``
   steps each; each is re-based on the backward measured under it (raw traffic slowed the
   profiled backward on a shared host), and the job keeps the one ``choose`` picks from rank
   0's measurements, the profiled steps' among them (``profiling.profiled_plan``). Deciding
   again on a re-based timeline would alternate: codecs' CPU slows the backward decided on.
3. ``SETTLED``: every ``drift_check_steps`` steps the workers vote on drift (iterations off
   the reference by more than ``drift`` for ``drift_steps`` steps). On drift they re-measure
   the link; if it changed they plan again (``TRIALS``), each plan's residuals handed to its
   successor (the servers' through rank 0); if not, the measured time becomes the reference.
``IDLE``: rank 0 had nothing to plan (every tensor travels row-sparse).
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import statistics
from typing import Callable, Sequence

import torch

from ...compressors import auto
from ...planner.decide import Plan, decide
from ...planner.fits import fit_link
from ...planner.profile import Profile
from ...planner.simulate import predict
from ...trace import now_us
from ..comm import OPS, Comm
from ..routes.planned import PlannedRoute
from .agreement import Agreement
from .clock import StepClock
from .profiling import choose, first_profile, profiled_plan, rebased
from .saved import plan_from_json, plan_json
from .tuning import PlanTuning

log = logging.getLogger(__name__)


class PlanStage(enum.Enum):
    PROFILING = "profiling"
    TRIALS = "trials"
    SETTLED = "settled"
    IDLE = "idle"


class AutoPlanner:
    """Plans how ``params`` travel and applies it through ``install``.

    Args:
        names, priority: the parameter table's (every worker the same).
        lr_of: a parameter's current learning rate (corrected error feedback).
        compression_params: the ``auto`` dict: its options (``compressors.auto``).
        install: ``install(route, params)`` puts ``params`` on ``route`` at this step
            boundary (None: back on their unplanned route).
        leave_out: whether a parameter travels another way (row-sparse) and is not planned.
        views: the plan's buckets hand averages back as views of their buffers.
        matrix_names: the names a factored matrix's first factor is seeded by (the table's).
        fused: each group of small tensors fused while profiling; sent_dtype: a tensor's dtype on the way.
    """

    def __init__(self, params: list[torch.Tensor], names: dict[int, str], priority: dict[int, int],
                 lr_of: Callable[[torch.Tensor], float], compression_params: dict,
                 install: Callable[[PlannedRoute | None, list[torch.Tensor]], None],
                 leave_out: Callable[[torch.Tensor], bool] = lambda p: False, views: bool = False,
                 tuning: PlanTuning | None = None, comm: Comm = OPS, matrix_names: dict[int, str] | None = None,
                 fused: Sequence[Sequence[str]] = (), sent_dtype: Callable[[torch.Tensor], torch.dtype] | None = None):
        self.params = list(params)
        self.names, self.priority, self.lr_of = names, priority, lr_of
        self.install, self.leave_out, self.views, self.matrix_names = install, leave_out, views, matrix_names
        self.fused, self.sent_dtype = [tuple(names) for names in fused], sent_dtype or (lambda p: p.dtype)
        self.tuning, self.comm = tuning or PlanTuning(), comm
        self.options = auto.for_dtypes(auto.options(compression_params), {str(p.dtype) for p in params})
        self.label = names[id(params[0])]
        self.stage = PlanStage.PROFILING
        self.plan: Plan | None = None
        self.route: PlannedRoute | None = None
        self.profile: Profile | None = None
        self.carry: dict[int, torch.Tensor] = {}   # residuals for the first plan (a checkpoint's)
        self.clock = StepClock([id(p) for p in params])
        self.agreement = Agreement(self.label, comm, self.tuning)
        self.trials: list[tuple[Plan, Profile, float]] = []   # measured so far: (plan, re-based profile, median s)
        self.pending: list[Plan] = []                          # the trial's plans not yet run
        self.baseline: tuple[Plan, Profile, float] | None = None   # the profiled steps (profiled_plan)
        self.measured_plans: list[tuple[Plan, float, float]] = []   # the last trial: plan, measured s, modelled s
        self.reference_s = 0.0     # what drift is measured against
        self.version = self._steps = 0

    @property
    def refined(self) -> bool:
        return self.stage in (PlanStage.SETTLED, PlanStage.IDLE)

    # ---- called by the pipeline ---------------------------------------------------

    def manages(self, p: torch.Tensor) -> bool:
        return id(p) in self.clock.ready

    def on_submit(self, p: torch.Tensor) -> None:
        if self.stage in (PlanStage.PROFILING, PlanStage.TRIALS):
            self.clock.mark_ready(id(p))

    def on_flush(self) -> None:
        self.clock.mark_backward_end()

    def after_step(self, step_s: float) -> None:
        """At the end of every step: profile, plan, measure a trial, or watch for drift."""
        self._steps += 1
        clock, tuning = self.clock, self.tuning
        if self.stage == PlanStage.PROFILING:
            clock.mark_cpu(self.comm.client.comm)
            if self._steps > 1:  # the first step compiles, allocates and declares
                clock.timeline.append((clock.backward_end, step_s))
                clock.measured.append(clock.elapsed())
            if self._steps >= max(2, self.comm.settings.plan_steps):
                self._make_plan()
        elif self.stage != PlanStage.IDLE:
            # kept only as far back as the re-basing and the drift check read
            clock.measured = clock.measured[-max(tuning.refine_steps, tuning.drift_steps):] + [clock.elapsed()]
            if self.stage == PlanStage.TRIALS:
                clock.mark_cpu(self.comm.client.comm)
                clock.timeline.append((clock.backward_end, step_s))
                if self.route.reducer is not None:
                    clock.factors.append(self.route.reducer.timings())
                if len(clock.timeline) > tuning.refine_steps:
                    self._refine()
            elif self._steps % tuning.drift_check_steps == 0 and self._drift_agreed():
                self._replan()
        clock.next_step()

    def checkpoint(self) -> dict | None:
        """The plan in force, to resume it (``restore``): None while profiling or idle."""
        if self.route is None:
            return None
        return {"version": self.version, "steps": self._steps, "reference_s": float(self.reference_s),
                "profile": self.profile.to_json(), "plan": plan_json(self.plan)}

    def restore(self, saved: dict) -> PlannedRoute:
        """Resume the plan of ``checkpoint()``, under the same keys (its trials, if any were
        still under way, are not resumed: the plan in force is kept)."""
        self.profile = Profile.from_json(saved["profile"], "the checkpoint's plan profile")
        plan = plan_from_json(saved["plan"])
        self._keep({t.name for t in self.profile.tensors})
        self.version, self._steps = int(saved["version"]), int(saved["steps"])
        self.trials, self.pending = [], []
        self._apply(plan)
        self.plan = dataclasses.replace(plan, refined=True)
        self.stage, self.reference_s = PlanStage.SETTLED, float(saved["reference_s"])
        return self.route

    def residuals(self) -> dict[int, torch.Tensor]:
        """The plan's error feedback by parameter id: this worker's, on rank 0 the servers'
        too, and whatever is still carried from before."""
        if self.route is None:
            return {pid: part.clone() for pid, part in self.carry.items()}
        return self.route.residuals(with_servers=self.comm.rank() == 0)

    # ---- the lifecycle --------------------------------------------------------------

    def _make_plan(self) -> None:
        round_trips, batches = self.agreement.probe(self.version)
        planned = [p for p in self.params if not self.leave_out(p)]
        def profiled() -> str:  # "": nothing left to plan
            return first_profile(self.clock, planned, self.names, self.priority, self.options, round_trips, batches,
                                 self.comm, self.params, self.fused, self.sent_dtype).to_json() if planned else ""
        text = self.agreement.broadcast(profiled, "PlanProfile", self.version)
        if not text:
            self._keep(set())
            self.stage = PlanStage.IDLE
            self.agreement.release()
            log.info("gradpress: every tensor the planner was given travels row-sparse; nothing to plan")
            return
        self.profile = Profile.from_json(text, "rank 0's profile")
        self._keep({t.name for t in self.profile.tensors})
        self.baseline = profiled_plan(self.profile, self.options, self.fused)
        self._start(decide(self.profile, list(self.options), self.comm.settings.min_compress_bytes))

    def _keep(self, planned: set[str]) -> None:
        """Plan only the tensors rank 0's profile names; the rest stay on their own routes."""
        left = [p for p in self.params if self.names[id(p)] not in planned]
        if left:
            log.info("gradpress: left out of the plan (row-sparse): %s", ", ".join(self.names[id(p)] for p in left))
        self.params = [p for p in self.params if self.names[id(p)] in planned]
        self.clock.forget([id(p) for p in left])

    def _start(self, plan: Plan) -> None:
        """Apply a decision's alternatives one by one, to be measured, and the decision last:
        the job usually keeps it, and then runs on without one more switch."""
        trials = [*plan.alternatives, dataclasses.replace(plan, alternatives=())]
        self.trials, self.pending = [], trials[1:]
        self.stage = PlanStage.TRIALS
        self._apply(trials[0])

    def _refine(self) -> None:
        """Re-base the plan in force on rank 0's steps measured under it; then measure the
        next alternative, or keep the one ``choose`` picks."""
        def refined() -> str:
            return rebased(self.profile, self.plan, self.clock, self.names, self.params).to_json()
        text = self.agreement.broadcast(refined, "PlanRefined", self.version)
        profile = Profile.from_json(text, "rank 0's refined profile")
        predicted = predict(*self.plan.simulated(profile))
        measured = float(profile.notes["measured_s"])
        log.info("gradpress: plan %d re-based on the backward measured under it (%.1f ms, profiled %.1f ms): "
                 "predicted %.1f ms (was %.1f ms), measured %.1f ms", self.version, 1e3 * profile.backward_end_s,
                 1e3 * self.profile.backward_end_s, 1e3 * predicted, 1e3 * self.plan.predicted_s, 1e3 * measured)
        self.profile = profile
        self.trials.append((dataclasses.replace(self.plan, predicted_s=predicted), profile, measured))
        if self.pending:
            self._switch(self.pending.pop(0))
            return
        # each trial's profile starts from the one before, so the last one carries every cost
        # the trial measured (a low-rank option's factor work): a re-plan decides on them
        in_force, latest = len(self.trials) - 1, self.trials[-1][1]
        if self.baseline is not None and not any(self.baseline[0].same_as(p) for p, _, _ in self.trials):
            self.trials.append(self.baseline)
        self.baseline = None  # (a re-plan's link is not the profiled one)
        best, modelled = choose(self.trials, self.tuning.trial_noise)
        plan, kept, kept_s = self.trials[best]
        self.profile = dataclasses.replace(kept, codecs=latest.codecs, notes={**latest.notes, **kept.notes})
        if len(self.trials) > 1:
            log.info("gradpress: plans measured (ms, and as modelled on common ground): %s; keeping %s",
                     "; ".join(f"{p.summary()}: {1e3 * m:.1f} ({1e3 * t:.1f})"
                               for (p, _, m), t in zip(self.trials, modelled)), plan.summary())
        if best != in_force:
            self._switch(plan)
        else:
            self.agreement.release()
        self.measured_plans = [(p, m, t) for (p, _, m), t in zip(self.trials, modelled)]
        self.trials = []
        self.stage = PlanStage.SETTLED
        self.plan = dataclasses.replace(plan, refined=True)
        # drift is measured against the time measured under the plan, not the prediction: a
        # model that mispredicts this job would otherwise re-measure the link for nothing
        self.reference_s = kept_s

    def _switch(self, plan: Plan) -> None:
        """Apply another plan at this step boundary; the residuals go to its first pushes."""
        self.version += 1
        self._leave_route()
        self._apply(plan)

    def _leave_route(self) -> None:
        """Hand the plan's residuals over and release its keys (after a collective at this step
        boundary, so every worker has pulled its last round of them)."""
        self.carry = self.residuals()
        names = self.route.key_names() if self.route is not None else []
        self.route = None
        self.agreement.release(names)

    def _apply(self, plan: Plan) -> None:
        self.route = PlannedRoute(plan, self.profile, self.params, self.names, self.priority, self.lr_of,
                                  self.options, self.version, self.label, self.comm, self.views,
                                  self.comm.settings.min_compress_bytes, carry=self.carry,
                                  matrix_names=self.matrix_names)
        self.carry = {}
        self.plan = plan
        self.install(self.route, self.params)
        self.clock.restart()
        self.reference_s = plan.predicted_s
        log.info("gradpress plan %d (rank %d):\n%s", self.version, self.comm.rank(), plan.table(self.profile))
        now = now_us()
        self.comm.client.tracer.add(f"plan {self.version}: {len(self.route.groups)} groups, "
                                    f"{len(self.route.factored)} matrices as factors, predicted "
                                    f"{1e3 * plan.predicted_s:.1f} ms", now, now, key=-1, round=self._steps)

    def _drift_agreed(self) -> bool:
        recent = self.clock.measured[-self.tuning.drift_steps:]
        drifted = len(recent) == self.tuning.drift_steps and all(
            abs(t / self.reference_s - 1) > self.tuning.drift for t in recent)
        return self.agreement.drift_vote(drifted)

    def _replan(self) -> None:
        recent = [round(1e3 * t, 1) for t in self.clock.measured[-self.tuning.drift_steps:]]
        self.version += 1
        round_trips, _ = self.agreement.probe(self.version)
        def relinked() -> str:  # "": the link is as profiled
            link = fit_link(round_trips, self.comm.size(), self.profile.codecs["none"].add, self.profile.message_s)
            changed = abs(link.bytes_per_s / self.profile.link.bytes_per_s - 1) > self.tuning.link_change
            return self.profile.scaled(bytes_per_s=link.bytes_per_s).to_json() if changed else ""
        text = self.agreement.broadcast(relinked, "PlanProfile", self.version)
        if not text:  # the link is as profiled: the model, not the network, is off
            log.info("gradpress: iterations (%s ms) are off the prediction, but the link is as profiled; "
                     "keeping plan %d", recent, self.version - 1)
            self.reference_s = statistics.median(self.clock.measured[-self.tuning.drift_steps:])
            self.clock.measured = []
            self.agreement.release()
            return
        log.info("gradpress: the link changed (iterations %s ms, %.1f ms predicted); re-planning", recent,
                 1e3 * self.plan.predicted_s)
        self._leave_route()
        self.profile = Profile.from_json(text, "rank 0's profile")
        self._start(decide(self.profile, list(self.options), self.comm.settings.min_compress_bytes))
