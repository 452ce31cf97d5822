"""Rank 0's profile of a job, made from what the ``StepClock`` measured, and its re-basing on
the steps measured under a plan; ``choose`` keeps one of the plans a trial measured."""
from __future__ import annotations

import dataclasses
import logging
import statistics
from typing import Sequence

import torch

from ... import host
from ...planner import calibrate, low_rank
from ...planner.decide import Plan
from ...planner.fits import fit_link, fit_message
from ...planner.profile import HostShare, Profile, TensorProfile
from ...planner.simulate import predict
from ...server.engine import engine_count, local_engine_count
from ...torch.dtypes import wire_dtype
from ..comm import Comm
from .clock import StepClock

log = logging.getLogger(__name__)


def first_profile(clock: StepClock, params: list[torch.Tensor], names: dict[int, str], priority: dict[int, int],
                  options: dict[str, dict], round_trips, batches, comm: Comm, given: list[torch.Tensor],
                  fused: Sequence[Sequence[str]] = (), sent_dtype=lambda p: p.dtype) -> Profile:
    """The profile of ``params`` from the profiled steps, the probe's times and the codecs'
    costs on this host (saved to ``GRADPRESS_PLAN_FILE`` too). ``given``: every tensor the
    planner was given, whose raw bytes the sockets' CPU per byte is measured over; ``fused``:
    the groups of small tensors the profiled steps fused (``profiled_plan``)."""
    on_gpu = bool(params) and params[0].is_cuda  # the codecs and copies are then timed on that GPU
    if on_gpu:
        from .gpu_costs import measure_on_device
        dev = params[0].device
        costs = calibrate.codec_costs(options, lambda p: measure_on_device(p, dev), torch.cuda.get_device_name(dev))
    else:
        costs = calibrate.codec_costs(options)
    message_s = fit_message(batches)
    link = fit_link(round_trips, comm.size(), costs["none"].add, message_s)
    s = comm.settings
    moved = 2 * raw_bytes(given, sent_dtype)
    profile = Profile(comm.size(), len(comm.client.book.servers), tensors(clock, params, names, priority, sent_dtype),
                      statistics.median(b for b, _ in clock.timeline),
                      statistics.median(t for _, t in clock.timeline), costs, link, message_s,
                      s.partition_bytes, s.scheduling_credit, server_lanes(comm),
                      notes={"profiled_steps": len(clock.timeline), "round_trips": round_trips, "batches": batches,
                             # the iteration with every tensor apart and uncompressed: a candidate of the trial
                             "profiled_s": statistics.median(clock.measured) if clock.measured else None},
                      host=host_share(clock, comm, moved), local_size=getattr(comm.client.book, "local_size", 1),
                      device="cuda" if on_gpu else "cpu")
    profile = message_fitted(profile, fused)
    if profile.message_s != message_s:
        log.info("gradpress: a GPU worker's cost per partition fitted to the profiled steps: %.3f ms (the probe's "
                 "%.3f ms)", 1e3 * profile.message_s, 1e3 * message_s)
    if s.plan_file:
        with open(s.plan_file, "w") as fh:
            fh.write(profile.to_json())
    return profile


def message_fitted(profile: Profile, fused: Sequence[Sequence[str]] = ()) -> Profile:
    """A GPU worker's ``profile`` with ``message_s`` raised until the model gives the profiled
    steps' plan (every tensor raw, as the job sent them) the time those steps took; as it is
    where the model already gives that much or more. Why: the probe times tiny push_pulls of
    host arrays, but each partition of a CUDA tensor also costs the worker its copies'
    events, stream waits and landings, in Python that contends for the GIL with the
    backward's hooks, which no calibration in isolation sees. On an H200 the model put
    plans of raw partitions 0.23 ms a partition short, alike with 126 partitions (0.067 s
    against 0.095) and 59 (0.051 against 0.065), so the cost is per partition, and a plan's
    count of partitions (fused or apart) was misjudged. A host's profile is left as it is:
    its probe goes the job's own path, and the model matched its jobs within 15%."""
    baseline = profiled_plan(profile, {"none": {}}, fused) if profile.device == "cuda" else None
    if baseline is None:
        return profile
    plan, _, measured = baseline

    def predicted(message_s: float) -> float:
        return predict(*plan.simulated(dataclasses.replace(profile, message_s=message_s)))
    if plan.predicted_s >= measured:  # (predicted on ``profile`` as it is)
        return profile
    low, high = profile.message_s, profile.message_s + measured  # high: the partitions alone take longer
    for _ in range(40):  # a bisection: the model's time grows with the cost of a message
        middle = (low + high) / 2
        low, high = (middle, high) if predicted(middle) < measured else (low, middle)
    return dataclasses.replace(profile, message_s=high, notes=dict(profile.notes, message_s_probed=profile.message_s))


def tensors(clock: StepClock, params: list[torch.Tensor], names: dict[int, str],
            priority: dict[int, int], sent_dtype=lambda p: p.dtype) -> tuple[TensorProfile, ...]:
    """``params`` in the order they became ready (median times: a pause between two steps,
    an evaluation say, is one step's outlier)."""
    typical = {id(p): statistics.median(clock.ready[id(p)] or [0.0]) for p in params}
    order = sorted(params, key=lambda p: (typical[id(p)], -priority[id(p)]))
    # the itemsize is the raw path's on the wire (``torch.dtypes.WIRE``: bfloat16 as float32),
    # of the dtype the tensors travel in (an optimizer's float32 state of a float16 parameter:
    # ``ParameterTable.sent_dtype``)
    dtypes = [sent_dtype(p) for p in order]
    return tuple(TensorProfile(names[id(p)], 4 * p.numel(), typical[id(p)], priority[id(p)],
                               p.shape[0] if p.dim() >= 2 and p.shape[0] > 0 else 1,
                               (wire_dtype(d) or d).itemsize) for p, d in zip(order, dtypes))


def factor_seconds(work_s: float, rebuild_s: float, marks: list) -> tuple[float, float]:
    """A planned step's factor work and reconstruction: the step's thread's seconds, or the
    device's where they took longer there (a GPU's ops run after the thread launched them)."""
    on_device = device_seconds(marks)
    if on_device is None:
        return work_s, rebuild_s
    return max(work_s, on_device[0]), max(rebuild_s, on_device[1])


def raw_bytes(tensors: Sequence[torch.Tensor], sent_dtype=lambda p: p.dtype) -> int:
    """What the raw path pushes of ``tensors``: each in the dtype it travels as (bfloat16 as float32)."""
    return sum(p.numel() * (wire_dtype(sent_dtype(p)) or sent_dtype(p)).itemsize for p in tensors)


def host_share(clock: StepClock, comm: Comm, moved_per_step: int) -> HostShare | None:
    """Who shares rank 0's CPUs (the address book's machine ids), its training's CPU and its
    sockets' CPU per byte; None where either is unknown."""
    mine = host.machine_id()
    if not mine or len(clock.cpu_marks) < 2:
        return None
    nodes = comm.client.book.sharing(mine)
    workers = sum(n.role == "worker" for n in nodes)
    servers = sum(n.role == "server" for n in nodes)
    return HostShare(host.cores(), max(workers, 1), servers, max(clock.train_cpu_s(), 0.0),
                     clock.wire_s_per_byte(moved_per_step))


def server_lanes(comm: Comm) -> int:
    """Threads doing a server's sums, as the simulator counts them: its engine threads, or 1
    for the I/O thread where it has none. A server on rank 0's machine shares its cores and
    follows the same rule as it (engine_count); one elsewhere is taken to have cores enough
    for the default (its cores are not in the address book)."""
    book, mine = comm.client.book, host.machine_id()
    setting = comm.settings.server_engine_threads
    threads = [local_engine_count(setting, book) if mine and n.machine == mine
               else engine_count(setting, float("inf"), 1) for n in book.servers]
    return max(min(threads, default=1), 1)


def rebased(profile: Profile, plan: Plan, clock: StepClock, names: dict[int, str],
            params: list[torch.Tensor]) -> Profile:
    """``profile`` re-based on the steps measured under ``plan`` (each list's first left out:
    it declared the plan's keys): the backward timeline, the step, the factor work and the
    training CPU, with the measured iteration time in its notes."""
    ready = {pid: times[1:] for pid, times in clock.ready.items()}
    timeline = clock.timeline[1:]
    by_name = {names[id(p)]: id(p) for p in params}
    # the decision's order kept: the plans' groups index it
    tensors_now = tuple(dataclasses.replace(t, ready_s=statistics.median(ready[by_name[t.name]] or [0.0]))
                        for t in profile.tensors)
    out = dataclasses.replace(profile, tensors=tensors_now,
                              backward_end_s=statistics.median(b for b, _ in timeline),
                              step_s=statistics.median(t for _, t in timeline),
                              notes=dict(profile.notes, refined_steps=len(timeline),
                                         measured_s=statistics.median(clock.measured[1:])))
    plan_cpu_s = 0.0  # the plan's own work on the training thread (factors)
    if plan.low_rank and len(clock.factors) > 1:  # (the first also seeds Q)
        factors = [factor_seconds(*f) for f in clock.factors[1:]]
        work_s, rebuild_s = statistics.median(w for w, _ in factors), statistics.median(r for _, r in factors)
        out = low_rank.measured(out, plan.low_rank_option, plan.low_rank, work_s, rebuild_s)
        plan_cpu_s = work_s + rebuild_s
    if out.host is not None:
        out = dataclasses.replace(out, host=dataclasses.replace(
            out.host, train_cpu_s=max(clock.train_cpu_s() - plan_cpu_s, 0.0)))
    return out


def profiled_plan(profile: Profile, options: dict, fused: Sequence[Sequence[str]] = ()
                  ) -> tuple[Plan, Profile, float] | None:
    """What the profiled steps ran, as one more measured plan of the first trial: the planned
    tensors uncompressed, as the job sends them without a codec (each apart, but for the
    groups of small ones named in ``fused``), with rank 0's median iteration over them. So a
    plan the model mispredicts (a GPU's launches and Python, which calibration in isolation
    does not see) is not kept over sending the gradients as they are. None where ``none`` is
    not an option (the user asked for codecs) or nothing was measured."""
    profiled_s = profile.notes.get("profiled_s")
    if "none" not in options or not profiled_s:
        return None
    index = {t.name: i for i, t in enumerate(profile.tensors)}
    groups = [tuple(sorted(index[name] for name in names)) for names in fused
              if len(names) > 1 and all(name in index for name in names)]
    grouped = {i for g in groups for i in g}
    groups = sorted(groups + [(i,) for i in range(len(profile.tensors)) if i not in grouped])
    plan = Plan(tuple(groups), ("none",) * len(groups), 0.0, 0.0)
    return dataclasses.replace(plan, predicted_s=predict(*plan.simulated(profile))), profile, float(profiled_s)


def choose(trials: list[tuple[Plan, Profile, float]], trial_noise: float) -> tuple[int, list[float]]:
    """Which measured plan to keep, and each one's modelled time: (plan, its re-based profile,
    its measured median s) per plan. The fastest measured, unless others measured within
    ``trial_noise`` of it: then, of those, the one the model puts fastest. The model runs
    each plan on its own measured timeline but on one training CPU for all (the median of
    theirs: training's CPU does not depend on the plan, and its noise would otherwise
    decide). A trial's median of 8 steps can move 5-10% between two measurements of one plan
    on a shared host; the codecs' CPU, which the model sees, tells such plans apart."""
    fastest = min(m for _, _, m in trials)
    trains = [p.host.train_cpu_s for _, p, _ in trials if p.host is not None]
    train = statistics.median(trains) if trains else 0.0
    modelled = []
    for plan, profile, _ in trials:
        if profile.host is not None:
            profile = dataclasses.replace(profile, host=dataclasses.replace(profile.host, train_cpu_s=train))
        modelled.append(predict(*plan.simulated(profile)))
    near = [i for i, (_, _, m) in enumerate(trials) if m <= fastest * (1 + trial_noise)]
    return min(near, key=lambda i: (modelled[i], trials[i][2], i)), modelled


def device_seconds(marks: list) -> tuple[float, float] | None:
    """A step's factor work and reconstruction on the device, in seconds, from its timing
    events (``LowRankReducer.timings``): stretches of work alternate with the sums' rounds,
    which are left out, and the reconstruction is the last; None without them (a host's)."""
    if len(marks) < 5:
        return None
    marks[-1].synchronize()   # (read at the re-basing, steps later: done long since)
    stretches = [a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:])]   # elapsed_time: ms
    return sum(stretches[:-1:2]), stretches[-1]
