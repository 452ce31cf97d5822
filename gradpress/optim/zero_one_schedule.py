"""0/1 Adam's schedule (arXiv 2202.06009; DeepSpeed's ``ZeroOneAdam``): which kind each step is.

Steps are counted from 1. Up to ``var_freeze_step`` (the variance phase):

- ``variance`` when the step is a multiple of the variance interval: the gradient is
  averaged uncompressed and updates both moments. The interval starts at 1 and doubles
  after every ``var_update_scaler`` variance updates (kappa in the paper), so the updates
  thin out exponentially: with kappa = 16, steps 1..16, then 18, 20, .., 48, then 52, ..;
- ``momentum`` otherwise: each worker's momentum travels compressed and the average
  becomes everyone's.

After it (the local phase), ``sync`` when the step is a multiple of the local-step
interval, else ``local`` (no communication). The interval starts at 1 and doubles, up to
``local_step_clipper`` (H in the paper), after every ``local_step_scaler`` steps of the
phase. These are DeepSpeed's parameters with DeepSpeed's meanings, and its sequence counted
in ``step()`` calls; the one difference is that DeepSpeed spends its first call on setting
up buffers, without an update (so its updates are that sequence less step 1): here step 1
is a variance step.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

KINDS = ("variance", "momentum", "sync", "local")


@dataclass
class ZeroOneSchedule:
    """The step counter and the two intervals; ``state()`` / ``from_state`` for checkpoints."""

    var_freeze_step: int
    var_update_scaler: int
    local_step_scaler: int
    local_step_clipper: int
    step: int = 0  # steps taken
    var_interval: int = 1
    var_counter: int = 0  # variance updates since the interval last doubled
    var_updates: int = 0  # variance updates in all (v's bias correction)
    local_interval: int = 1
    local_counter: int = 0  # local-phase steps since the interval last doubled

    def __post_init__(self) -> None:
        if self.var_freeze_step < 1:
            raise ValueError(f"var_freeze_step={self.var_freeze_step}: the variance is first updated at step 1, "
                             f"so the freeze must come at step 1 or later")
        for name in ("var_update_scaler", "local_step_scaler", "local_step_clipper"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: must be an integer >= 1")

    @property
    def frozen(self) -> bool:
        """True once the variance phase is over (the next step is a sync or local step)."""
        return self.step >= self.var_freeze_step

    def next_kind(self) -> str:
        """The kind of the next step: variance, momentum, sync or local."""
        t = self.step + 1
        if t <= self.var_freeze_step:
            return "variance" if t % self.var_interval == 0 else "momentum"
        return "sync" if t % self.local_interval == 0 else "local"

    def advance(self) -> str:
        """Count the next step taken; returns its kind."""
        kind = self.next_kind()
        if kind == "variance":
            self.var_updates += 1
            self.var_counter += 1
            if self.var_counter == self.var_update_scaler:
                self.var_counter, self.var_interval = 0, 2 * self.var_interval
        elif kind in ("sync", "local"):
            self.local_counter += 1
            if self.local_counter == self.local_step_scaler:
                self.local_counter = 0
                self.local_interval = min(self.local_step_clipper, 2 * self.local_interval)
        self.step += 1
        return kind

    def state(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict) -> "ZeroOneSchedule":
        return cls(**state)
