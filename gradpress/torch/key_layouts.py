"""The layout each name of this job's keys was first given, so that a name used again for
a tensor of another size or dtype (a GAN's second model, whose parameter names are the
first's) is found where the user can be told, or given a key of its own, before a
declaration mismatch stops the job on a key the user never named. Decided by names and
layouts alone, in the order every worker makes its collective calls: the same on every
worker. Kept per job (``ops.job_epoch``): a resumed job declares its keys afresh."""
from __future__ import annotations

from typing import Hashable

from . import ops


class KeyLayouts:
    def __init__(self) -> None:
        self._jobs: dict[int, dict[str, Hashable]] = {}

    def claim(self, name: str, layout: Hashable) -> bool:
        """Whether ``name`` may carry ``layout``: it is new (and now has it), or has it already."""
        return self._jobs.setdefault(ops.job_epoch(), {}).setdefault(name, layout) == layout
