"""Choose each tensor's compression and the fusion groups, by simulated iteration time.

Espresso's greedy search (arXiv 2205.14465), adapted to a parameter server and to
MergeComp's fusion (arXiv 2103.15195):

1. Fusion boundaries, MergeComp's way (by simulated time, without model knowledge):
   consecutive tensors in backward order merged until a group holds at least ``threshold``
   bytes (a tensor that large alone stays alone: only small ones are copied into groups),
   for thresholds from 0 (every tensor apart) to 16 MB; each grouping is scored by
   its best uniform plan (one option for every group that may be compressed).
2. On the best grouping, Espresso's greedy search from that uniform plan: visit the groups
   largest first (ties: the one nearer the output, which is ready first), try each option
   with the others fixed, keep the one of least simulated iteration time. Groups smaller
   than ``min_compress_bytes`` stay uncompressed (their payload is latency, not bytes), and
   an uncompressed group that lands before backward ends is not tried: it is hidden behind
   computation, so sending it smaller cannot shorten the iteration. A uniform plan that
   already reaches the floor (backward, the fused groups' copies, the optimizer's step) is
   kept as it is.

3. A low-rank option (``planner/low_rank.py``) is one more candidate: every matrix it can
   factor travels as factors, and the rest is planned as above on the derived profile; the
   faster of the two plans is chosen.
4. The plan's ``alternatives``, for the job to run and measure (``pipeline/planning/planner.py``
   keeps the fastest rank 0 measured; of plans measured within its noise, the fastest
   modelled): the best plan of the other kind (factoring or
   not), the chosen plan with every tensor apart where it fuses any (each keeps its
   group's option: MergeComp sets boundaries by measurement, and on a shared CPU a fused
   group's copies slow backward in ways the simulator does not see), and each option's
   best uniform plan predicted within ``TRIAL_MARGIN`` of the chosen one, at most
   ``TRIALS`` in all. The simulator bounds an iteration by a shared host's
   CPU but does not see how the codecs' CPU slows backward down, so plans it ranks close
   together are ranked by measurement instead. Plans predicted alike (every compressed
   plan that hides behind backward is at the floor) go in the order of the host CPU they
   take, least first: with more such plans than trials, the CPU-dearest are left out (on
   a 2-core host, name order had left out random-k, the fastest measured).

The result is a pure function of the profile and the options, so every worker, given
rank 0's profile, computes the same plan.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from . import low_rank
from .profile import Profile
from .simulate import Group, Layout

THRESHOLDS = (0, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)
TRIAL_MARGIN = 1.5   # a uniform plan predicted this close to the chosen one is worth measuring
TRIALS = 4           # at most this many alternatives measured (each costs a few steps): 5 plans of 6 default options


@dataclass(frozen=True)
class Plan:
    groups: tuple[Group, ...]     # tensor indices, consecutive in ready order
    options: tuple[str, ...]      # how each group travels (an option name; "none": raw fp32)
    predicted_s: float            # simulated seconds per iteration
    decision_ms: float
    low_rank: tuple[int, ...] = ()    # tensors that travel as factors, in no group
    low_rank_option: str | None = None
    refined: bool = False             # settled: predicted_s re-based on the backward measured under it
    # plans for the job to try and measure, best predicted first (step 4 of the module's doc)
    alternatives: tuple["Plan", ...] = ()

    def same_as(self, other: "Plan") -> bool:
        """Sends every tensor the same way (predictions aside)."""
        return (self.groups, self.options, self.low_rank, self.low_rank_option) == \
            (other.groups, other.options, other.low_rank, other.low_rank_option)

    def table(self, profile: Profile) -> str:
        """The plan as a table: tensor, size, decision, group, predicted landing (a matrix
        sent as factors: the landing of all the factors)."""
        sim, groups, options = self.simulated(profile)
        layout = Layout(sim, groups, sorted(set(options)))
        names = layout.options
        layout.predict(np.array([names.index(o) for o in options], np.int64))
        lands = layout.landings()
        rows = [f"{'tensor':40s} {'bytes':>11s} {'decision':10s} {'group':>5s} {'ready ms':>9s} {'lands ms':>9s}"]
        entries = [(i, self.options[g], str(g), lands[g]) for g, members in enumerate(self.groups) for i in members]
        entries += [(i, self.low_rank_option, "-", lands[-1]) for i in self.low_rank]
        for i, decision, g, land in sorted(entries):
            t = profile.tensors[i]
            rows.append(f"{t.name[:40]:40s} {t.nbytes:11d} {decision:10s} {g:>5s} "
                        f"{1e3 * t.ready_s:9.2f} {1e3 * land:9.2f}")
        rows.append(f"predicted iteration: {1e3 * self.predicted_s:.1f} ms ({len(self.groups)} groups, "
                    f"{len(self.low_rank)} matrices as factors, {len(profile.tensors)} tensors; "
                    f"decided in {self.decision_ms:.2f} ms)")
        for alt in self.alternatives:
            rows.append(f"to measure too: {alt.summary()}, predicted {1e3 * alt.predicted_s:.1f} ms")
        return "\n".join(rows)

    def summary(self) -> str:
        """How many groups travel each way, e.g. ``onebit x 12, none x 30``."""
        counts = {o: self.options.count(o) for o in sorted(set(self.options))}
        parts = [f"{o} x {n}" for o, n in counts.items()]
        if self.low_rank:
            parts.append(f"{len(self.low_rank)} matrices as {self.low_rank_option} factors")
        return ", ".join(parts) or "nothing"

    def simulated(self, profile: Profile) -> tuple[Profile, list[Group], list[str]]:
        """The profile, groups and options the simulator runs for this plan (the derived
        profile of ``planner/low_rank.py`` and its factor group when some matrices are factored)."""
        if not self.low_rank:
            return profile, list(self.groups), list(self.options)
        sim, kept = low_rank.derived(profile, self.low_rank_option, self.low_rank)
        where = {orig: j for j, orig in enumerate(kept)}
        groups = [tuple(where[i] for i in g) for g in self.groups] + [(len(kept),)]
        return sim, groups, list(self.options) + ["none"]


def group_by_threshold(profile: Profile, threshold: int) -> list[Group]:
    """Consecutive tensors (ready order) merged until each group holds ``threshold`` bytes;
    a tensor of ``threshold`` bytes or more is a group of its own. Merging is for small
    tensors (a message each); copying a large one into a group buffer and back out every
    step costs more than its one message (the MLP's 67 MB matrix fused with a 16 KB bias
    ran 1.2x slower than sent apart, at 100 Mbit/s, the copies on the training thread)."""
    groups: list[Group] = []
    current: list[int] = []
    size = 0
    for i, t in enumerate(profile.tensors):
        if current and t.nbytes >= threshold:
            groups.append(tuple(current))
            current, size = [], 0
        current.append(i)
        size += t.nbytes
        if size >= threshold:
            groups.append(tuple(current))
            current, size = [], 0
    if current:
        groups.append(tuple(current))
    return groups


def decide(profile: Profile, options: list[str], min_compress_bytes: int = 65536) -> Plan:
    """The plan of least simulated iteration time over ``options`` (names in ``profile.codecs``).

    Raises:
        ValueError: an option the profile has no costs for, or no option at all.
    """
    if not options:
        raise ValueError("the planner needs at least one option")
    unknown = sorted(set(options) - set(profile.codecs))
    if unknown:
        raise ValueError(f"options {unknown} have no measured costs in the profile ({sorted(profile.codecs)})")
    start = time.perf_counter()
    factored = sorted(o for o in set(options) if profile.codecs[o].low_rank)
    if len(factored) > 1:
        raise ValueError(f"options {factored}: at most one low-rank option (its matrices are reduced together)")
    elementwise = sorted(set(options) - set(factored)) or ["none"]
    groups, chosen, t, uniform = _decide_elementwise(profile, elementwise, min_compress_bytes, factors=False)
    plan = Plan(groups, chosen, t, 0.0)
    other = None
    matrices = low_rank.eligible(profile, factored[0], min_compress_bytes) if factored else ()
    if matrices:
        sim, kept = low_rank.derived(profile, factored[0], matrices)
        groups, chosen, t, _ = _decide_elementwise(sim, elementwise, min_compress_bytes, factors=True)
        # the factor group is the last: it is no group of the plan
        factoring = Plan(tuple(tuple(kept[i] for i in g) for g in groups[:-1]), chosen[:-1], t, 0.0, matrices,
                         factored[0])
        plan, other = (factoring, plan) if t < plan.predicted_s else (plan, factoring)
    apart = None if plan.low_rank else _apart(profile, plan, elementwise, min_compress_bytes)
    # plans predicted alike (at the floor, every compressed plan can be) in the order of the host
    # CPU they take: what the simulator leaves out, a codec's CPU slowing backward, is least there
    uniform = sorted(uniform, key=lambda u: (round(u[0], 9), u[3]))
    alternatives = _alternatives(plan, other, apart, [Plan(g, o, t, 0.0) for t, g, o, _ in uniform])
    return replace(plan, decision_ms=1e3 * (time.perf_counter() - start), alternatives=alternatives)


def _apart(profile: Profile, plan: Plan, options: list[str], min_compress_bytes: int) -> Plan | None:
    """``plan`` with every tensor in a group of its own, each taking its group's option (a
    tensor under ``min_compress_bytes`` raw, as the search leaves such groups); None where
    the plan fuses nothing."""
    if all(len(g) == 1 for g in plan.groups):
        return None
    names = sorted(set(options) | {"none"})
    groups, chosen = [], []
    for members, option in zip(plan.groups, plan.options):
        for i in members:
            groups.append((i,))
            chosen.append(option if profile.tensors[i].nbytes >= min_compress_bytes else "none")
    t = Layout(profile, groups, names).predict(np.array([names.index(o) for o in chosen], np.int64))
    return Plan(tuple(groups), tuple(chosen), t, 0.0)


def _alternatives(plan: Plan, other: Plan | None, apart: Plan | None, uniform: list[Plan]) -> tuple[Plan, ...]:
    """Step 4: the other kind of plan always (the simulator's blind spot is largest
    between them), then within ``TRIALS``, the chosen plan unfused and the uniform plans
    near the chosen one, best predicted first."""
    out = [other] if other is not None else []
    if apart is not None and len(out) < TRIALS and not apart.same_as(plan):
        out.append(apart)
    near = sorted((u for u in uniform if u.predicted_s <= TRIAL_MARGIN * plan.predicted_s),
                  key=lambda u: round(u.predicted_s, 9))  # (stable: ties keep their order)
    for u in near:
        if len(out) < TRIALS and not any(u.same_as(p) for p in [plan] + out):
            out.append(u)
    return tuple(out)


def _decide_elementwise(profile: Profile, options: list[str], min_compress_bytes: int, factors: bool
                        ) -> tuple[tuple[Group, ...], tuple[str, ...], float,
                                   list[tuple[float, tuple[Group, ...], tuple[str, ...], float]]]:
    """Steps 1 and 2: groups, each group's option, the simulated time; and each option's
    best uniform plan (time, groups, options, the host CPU it takes: ``Layout.cpu_s``). With
    ``factors`` the profile's last tensor is the low-rank factors: alone in its group, sent raw."""
    names = sorted(set(options) | {"none"})
    # the option that sends the most first: ties go to it, as it loses the least
    allowed = [names.index(o) for o in sorted(set(options), key=lambda o: (-profile.codecs[o].payload_ratio, o))]
    layouts = [Layout(profile, _grouping(profile, th, factors), names) for th in THRESHOLDS]
    pinned = len(layouts[0].groups) - 1 if factors else -1
    per_option = [_uniform(layout, allowed, min_compress_bytes, pinned) for layout in layouts]
    # each layout's best (ties to the option tried first), then the best layout (ties to the finer)
    best = [_first_best(options_t) for options_t in per_option]
    i = min(range(len(layouts)), key=lambda i: (best[i][0], i))
    t, assignment = best[i][:2]
    uniform = [min(((per_option[j][k][0], j, per_option[j][k][1], per_option[j][k][2]) for j in range(len(layouts))),
                   key=lambda x: (x[0], x[1])) for k in range(len(allowed))]
    if t > layouts[i].floor_s() + 1e-9:  # at the floor, no plan can be faster
        assignment, t = _greedy(layouts[i], allowed, assignment, min_compress_bytes, pinned)
    return (tuple(layouts[i].groups), tuple(names[a] for a in assignment), t,
            [(ut, tuple(layouts[ui].groups), tuple(names[a] for a in ua), cpu) for ut, ui, ua, cpu in uniform])


def _grouping(profile: Profile, threshold: int, factors: bool) -> list[Group]:
    """``group_by_threshold``; with ``factors`` the last tensor kept in a group of its own."""
    if not factors:
        return group_by_threshold(profile, threshold)
    last = len(profile.tensors) - 1
    head = [tuple(i for i in g if i != last) for g in group_by_threshold(profile, threshold)]
    return [g for g in head if g] + [(last,)]


def _uniform(layout: Layout, allowed: list[int], min_compress_bytes: int,
             pinned: int = -1) -> list[tuple[float, np.ndarray, float]]:
    """For each option of ``allowed``, the plan that sends every group above
    ``min_compress_bytes`` that way, its simulated time and host CPU; group ``pinned`` is
    always raw."""
    sizes = layout.group_bytes
    none = layout.options.index("none")
    out = []
    for o in allowed:
        assignment = np.array([o if b >= min_compress_bytes and g != pinned else none
                               for g, b in enumerate(sizes)], np.int64)
        out.append((layout.predict(assignment), assignment, layout.cpu_s()))
    return out


def _first_best(candidates: list[tuple[float, np.ndarray, float]]) -> tuple[float, np.ndarray, float]:
    """The fastest; a later one only where it is faster by more than rounding."""
    best = candidates[0]
    for c in candidates[1:]:
        if c[0] < best[0] - 1e-12:
            best = c
    return best


def _greedy(layout: Layout, allowed: list[int], assignment: np.ndarray,
            min_compress_bytes: int, pinned: int = -1) -> tuple[np.ndarray, float]:
    """Espresso's search from ``assignment``: each group, largest first, takes the option that
    makes the simulated iteration shortest with the others fixed."""
    sizes, none = layout.group_bytes, layout.options.index("none")
    assignment = assignment.copy()
    best = layout.predict(assignment)
    order = sorted(range(len(sizes)), key=lambda g: (-sizes[g], g))
    for g in order:
        if sizes[g] < min_compress_bytes or g == pinned:
            continue
        # Espresso's pruning: an uncompressed group that lands before backward ends is hidden
        # behind computation, and sending it smaller cannot shorten the iteration (a compressed
        # one is tried: another option may cost the shared link or CPU less)
        if assignment[g] == none and layout.landings()[g] <= layout.profile.backward_end_s:
            continue
        for o in allowed:
            if o == assignment[g]:
                continue
            was = assignment[g]
            assignment[g] = o
            t = layout.predict(assignment)
            if t < best - 1e-12:
                best = t
            else:
                assignment[g] = was
        layout.predict(assignment)  # leave the landings of the kept plan for the next test
    return assignment, best


def benchmark_decision_ms(n_tensors: int = 200, repeats: int = 20) -> float:
    """Median milliseconds of one decision for a synthetic model of ``n_tensors`` tensors."""
    from .synthetic import synthetic_profile
    profile = synthetic_profile(n_tensors)
    options = sorted(profile.codecs)
    decide(profile, options)  # compile / load the kernel first
    times = [decide(profile, options).decision_ms for _ in range(repeats)]
    return float(np.median(times))
