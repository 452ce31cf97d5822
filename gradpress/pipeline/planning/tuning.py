"""``PlanTuning``: the planner's constants, validated; a job passes its own (tests do)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlanTuning:
    """How the planner measures, when it re-bases and when it re-plans.

    Attributes:
        probe_bytes: the sizes of the link probe's single push_pulls (round trips).
        probe_repeats: timed repeats of each probe (their median counts; one untimed first).
        refine_steps: planned steps measured before the plan is re-based on them (the first
            is left out). A median of 8: the first 2-3 steps after a switch run slow (new
            keys, fresh memory) on a noisy host.
        drift: relative distance from the reference iteration time that counts as drift...
        drift_steps: ... for this many consecutive steps.
        drift_check_steps: how often the workers agree on whether to re-measure the link.
        link_change: a re-measured link this far from the profile's is a changed link.
        trial_noise: trial medians this close are told apart by the model (``choose``).
    """
    probe_bytes: tuple[int, ...] = (64 << 10, 512 << 10, 2 << 20)
    probe_repeats: int = 3
    refine_steps: int = 8
    drift: float = 0.2
    drift_steps: int = 5
    drift_check_steps: int = 10
    link_change: float = 0.2
    trial_noise: float = 0.05

    def __post_init__(self) -> None:
        if not self.probe_bytes or any(b < 4 for b in self.probe_bytes):
            raise ValueError(f"PlanTuning.probe_bytes={self.probe_bytes}: give sizes of at least 4 bytes")
        for name in ("probe_repeats", "refine_steps", "drift_steps", "drift_check_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"PlanTuning.{name}={getattr(self, name)}: must be at least 1")
        if self.trial_noise < 0:
            raise ValueError(f"PlanTuning.trial_noise={self.trial_noise}: must be >= 0")
