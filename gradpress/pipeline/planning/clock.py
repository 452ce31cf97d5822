"""``StepClock``: what the planner measures of each step: when each tensor became ready,
when backward ended, how long the step took, and the training thread's CPU."""
from __future__ import annotations

import statistics
import time

from ... import host


class StepClock:
    def __init__(self, ids: list[int]):
        self.iter_start = time.perf_counter()
        self.backward_end = 0.0
        self.ready: dict[int, list[float]] = {pid: [] for pid in ids}   # since the iteration's start, per step
        self.timeline: list[tuple[float, float]] = []                    # (backward end, step s) per step
        # (factor work, reconstruction) s of the step's thread, and a GPU's timing events, per planned step
        self.factors: list[tuple[float, float, list]] = []
        self.measured: list[float] = []                # iteration s of planned steps
        self.cpu_marks: list[tuple[float, float]] = []  # (training, sockets) CPU s at each step's end
        self._training_cpu: host.TrainingCpu | None = None

    def restart(self) -> None:
        """Measure afresh (a new plan): the ready times, timeline, factors and CPU marks."""
        self.ready = {pid: [] for pid in self.ready}
        self.timeline, self.factors, self.measured, self.cpu_marks = [], [], [], []

    def forget(self, ids: list[int]) -> None:
        for pid in ids:
            self.ready.pop(pid, None)

    def mark_ready(self, pid: int) -> None:
        if pid in self.ready:
            self.ready[pid].append(time.perf_counter() - self.iter_start)

    def mark_backward_end(self) -> None:
        self.backward_end = time.perf_counter() - self.iter_start

    def elapsed(self) -> float:
        return time.perf_counter() - self.iter_start

    def next_step(self) -> None:
        self.iter_start = time.perf_counter()

    def mark_cpu(self, comm_thread) -> None:
        if not host.TrainingCpu.available():  # (then no host share: the model has no CPU bound)
            return
        if self._training_cpu is None:
            self._training_cpu = host.TrainingCpu(comm_thread)
        self.cpu_marks.append(self._training_cpu.read())

    def train_cpu_s(self) -> float:
        """Training CPU per step: the median over the steps marked (after a switch 2-3 steps
        run slow, and a mean of 8 came out 0.21 CPU s where the median, and the steps after
        it, were 0.16-0.18)."""
        return train_cpu_s(self.cpu_marks)

    def wire_s_per_byte(self, moved_per_step: int) -> float:
        """What a byte sent or received cost this worker's sockets (ZeroMQ's threads: TCP,
        CURVE) over the steps marked, ``moved_per_step`` bytes a step."""
        marks = self.cpu_marks
        if len(marks) < 2 or moved_per_step == 0:
            return 0.0
        return max(marks[-1][1] - marks[0][1], 0.0) / (len(marks) - 1) / moved_per_step


def train_cpu_s(marks: list[tuple[float, float]]) -> float:
    """The median training CPU between consecutive marks (0 with fewer than two)."""
    return statistics.median(b[0] - a[0] for a, b in zip(marks, marks[1:])) if len(marks) > 1 else 0.0
