"""``Agreement``: the planner's collectives (every worker at once, at a step boundary): rank
0's profile broadcast, the link probe, the drift vote. It records the name of every tensor
it makes, and releases exactly those it no longer needs."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from ...errors import JobError
from ...planner.fits import probe_batches
from ...torch.handles import wait_all
from ..comm import Comm
from .tuning import PlanTuning


class Agreement:
    """Collectives named after ``label`` (two planners in one job must not share keys)."""

    def __init__(self, label: str, comm: Comm, tuning: PlanTuning):
        self.label, self.comm, self.tuning = label, comm, tuning
        self.made: list[str] = []        # tensors made and not yet released
        self._last: list[str] = []       # the latest broadcast's: kept until the next one

    def broadcast(self, make: Callable[[], str], kind: str, version: int) -> str:
        """Rank 0's text, which ``make()`` makes there (called on rank 0 only), on every worker.
        Where ``make`` raises on rank 0 (its calibration out of GPU memory, say), every
        worker raises: rank 0 its own error once it has sent the others its cause, they a
        JobError quoting it. Else they would wait out the op deadline in the broadcast,
        where rank 0's program caught its error and went on."""
        from ...torch.objects import ObjectError, broadcast_bytes
        payload = error = caught = None
        if self.comm.rank() == 0:
            try:
                payload = make().encode()
            except Exception as e:  # noqa: BLE001 - whatever it is, the others hear of it
                caught, error = e, f"{type(e).__name__}: {e}"
        made: list[str] = []
        try:
            data = broadcast_bytes(payload, error, 0, f"{kind}.{self.label}.{version}", made=made)
        except ObjectError as e:
            self.made += made
            if caught is not None:
                raise caught
            raise JobError(f"gradpress's planner: rank 0 could not make its {kind} ({e})") from e
        self.made += self._last
        self._last = made
        return data.decode()

    def drift_vote(self, drifted: bool) -> bool:
        """Whether any worker saw drift."""
        flag = torch.tensor([1.0 if drifted else 0.0])
        name = f"PlanDrift.{self.label}"
        self.comm.wait(self.comm.start(flag, name, average=False))
        return float(flag[0]) > 0

    def probe(self, version: int) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
        """Median times of uncompressed push_pulls: one of a few sizes (round trips), and
        batches of tiny ones in flight together, within the credit (messages)."""
        settings = self.comm.settings
        round_trips, batches = [], []
        for nbytes in self.tuning.probe_bytes:
            nbytes = min(nbytes, settings.partition_bytes)
            tensors = [torch.zeros(nbytes // 4)]
            round_trips.append((nbytes, self._timed(tensors, f"PlanProbe.{self.label}.{version}.{nbytes}")))
        for k in probe_batches(settings.scheduling_credit):
            tensors = [torch.zeros(64) for _ in range(k)]
            batches.append((k, self._timed(tensors, f"PlanProbe.{self.label}.{version}.batch{k}")))
        return round_trips, batches

    def _timed(self, tensors: list[torch.Tensor], name: str) -> float:
        names = [f"{name}.{i}" for i in range(len(tensors))]
        self.made += [n for n in names if n not in self.made]  # (sizes clipped to a partition repeat)
        times = []
        for r in range(self.tuning.probe_repeats + 1):
            t = time.perf_counter()
            wait_all([self.comm.start(x, n, average=False) for x, n in zip(tensors, names)], self.comm.wait)
            if r:  # the first declares the keys and sets the servers up
                times.append(time.perf_counter() - t)
        return statistics.median(times)

    def release(self, also: list[str] = ()) -> None:
        """Forget the tensors made so far but the latest broadcast's (and ``also``), here and,
        from rank 0, on the servers. Call it after a collective at a step boundary: every
        worker is then through everything made before it."""
        names = list(dict.fromkeys([*also, *self.made]))
        self.made = []
        if names:
            self.comm.client.release(names, servers=self.comm.rank() == 0)
