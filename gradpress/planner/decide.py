"""Choose each tensor's compression and the fusion groups, by simulated iteration time.

Espresso's greedy search (arXiv 2205.14465), adapted to a parameter server and to
MergeComp's fusion (arXiv 2103.15195):

1. Fusion boundaries, MergeComp's way (by simulated time, without model knowledge):
   consecutive tensors in backward order merged until a group holds at least ``threshold``
   bytes, for thresholds from 0 (every tensor apart) to 16 MB; each grouping is scored by
   its best uniform plan (one option for every group that may be compressed).
2. On the best grouping, Espresso's greedy search from that uniform plan: visit the groups
   largest first (ties: the one nearer the output, which is ready first), try each option
   with the others fixed, keep the one of least simulated iteration time. Groups smaller
   than ``min_compress_bytes`` stay uncompressed (their payload is latency, not bytes), and
   an uncompressed group that lands before backward ends is not tried: it is hidden behind
   computation, so sending it smaller cannot shorten the iteration. A uniform plan that
   already reaches the floor (backward, the fused groups' copies, the optimizer's step) is
   kept as it is.

The result is a pure function of the profile and the options, so every worker, given
rank 0's profile, computes the same plan.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .profile import Profile
from .simulate import Group, Layout

THRESHOLDS = (0, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)


@dataclass(frozen=True)
class Plan:
    groups: tuple[Group, ...]     # tensor indices, consecutive in ready order
    options: tuple[str, ...]      # how each group travels (an option name; "none": raw fp32)
    predicted_s: float            # simulated seconds per iteration
    decision_ms: float

    def table(self, profile: Profile) -> str:
        """The plan as a table: tensor, size, decision, group, predicted landing."""
        layout = Layout(profile, list(self.groups), sorted(set(self.options)))
        names = layout.options
        layout.predict(np.array([names.index(o) for o in self.options], np.int64))
        lands = layout.landings()
        rows = [f"{'tensor':40s} {'bytes':>11s} {'decision':10s} {'group':>5s} {'ready ms':>9s} {'lands ms':>9s}"]
        for g, members in enumerate(self.groups):
            for i in members:
                t = profile.tensors[i]
                rows.append(f"{t.name[:40]:40s} {t.nbytes:11d} {self.options[g]:10s} {g:5d} "
                            f"{1e3 * t.ready_s:9.2f} {1e3 * lands[g]:9.2f}")
        rows.append(f"predicted iteration: {1e3 * self.predicted_s:.1f} ms ({len(self.groups)} groups, "
                    f"{len(profile.tensors)} tensors; decided in {self.decision_ms:.2f} ms)")
        return "\n".join(rows)


def group_by_threshold(profile: Profile, threshold: int) -> list[Group]:
    """Consecutive tensors (ready order) merged until each group holds ``threshold`` bytes."""
    groups: list[Group] = []
    current: list[int] = []
    size = 0
    for i, t in enumerate(profile.tensors):
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
    names = sorted(set(options) | {"none"})
    # the option that sends the most first: ties go to it, as it loses the least
    allowed = [names.index(o) for o in sorted(set(options), key=lambda o: (-profile.codecs[o].payload_ratio, o))]
    layouts = [Layout(profile, group_by_threshold(profile, th), names) for th in THRESHOLDS]
    uniform = [_uniform_best(layout, allowed, min_compress_bytes) for layout in layouts]
    i = min(range(len(layouts)), key=lambda i: (uniform[i][0], i))
    assignment, t = uniform[i][1], uniform[i][0]
    if t > layouts[i].floor_s() + 1e-9:  # at the floor, no plan can be faster
        assignment, t = _greedy(layouts[i], allowed, assignment, min_compress_bytes)
    return Plan(tuple(layouts[i].groups), tuple(names[a] for a in assignment), t,
                1e3 * (time.perf_counter() - start))


def _sizes(layout: Layout) -> list[int]:
    return layout.group_bytes


def _uniform_best(layout: Layout, allowed: list[int], min_compress_bytes: int) -> tuple[float, np.ndarray]:
    """The best plan that sends every group above ``min_compress_bytes`` the same way
    (ties to the option tried first: the one that sends the most, so loses the least)."""
    sizes = _sizes(layout)
    none = layout.options.index("none")
    best = (np.inf, None)
    for o in allowed:
        assignment = np.array([o if b >= min_compress_bytes else none for b in sizes], np.int64)
        t = layout.predict(assignment)
        if t < best[0] - 1e-12:
            best = (t, assignment)
    return best


def _greedy(layout: Layout, allowed: list[int], assignment: np.ndarray,
            min_compress_bytes: int) -> tuple[np.ndarray, float]:
    """Espresso's search from ``assignment``: each group, largest first, takes the option that
    makes the simulated iteration shortest with the others fixed."""
    sizes = _sizes(layout)
    assignment = assignment.copy()
    best = layout.predict(assignment)
    order = sorted(range(len(sizes)), key=lambda g: (-sizes[g], g))
    for g in order:
        if sizes[g] < min_compress_bytes:
            continue
        # Espresso's pruning: a group that lands before backward ends is hidden behind
        # computation, and sending it smaller cannot shorten the iteration
        if layout.landings()[g] <= layout.profile.backward_end_s and assignment[g] == allowed[0]:
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
