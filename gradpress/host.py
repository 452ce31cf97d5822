"""The CPUs a process runs on: which of a job's processes share them, how many there are,
and how a worker's CPU time splits between training and communication.

The planner needs these where workers and servers share a host's cores (a small cluster,
a test, the benchmarks on this machine): an iteration then takes at least the host's CPU
work divided by its cores, whatever the network does (``planner/simulate.py``).
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

# ZeroMQ's I/O and reaper threads (libzmq names them): their CPU is communication
_ZMQ_THREADS = "ZMQbg/"


def machine_id() -> str:
    """Processes with the same id compete for the same CPUs: the kernel's boot id (one per
    machine, the same in every network namespace and container on it) and this process's
    CPU cgroup (a container or pod with its own CPU allotment counts as a machine of its
    own). '' where /proc says neither."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""
    return f"{boot}:{_cpu_cgroup()}"


def _cpu_cgroup() -> str:
    """This process's cgroup for CPU: the v1 ``cpu`` controller's, else the v2 unified one."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return ""
    unified = ""
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
        if controllers == "":
            unified = path
    return unified


def cores() -> float:
    """CPUs this process may use: its affinity, capped by a cgroup v2 quota (``cpu.max``)."""
    try:
        n = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        n = float(os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            n = min(n, int(quota) / int(period))
    except (OSError, ValueError):
        pass
    return max(n, 0.01)


class TrainingCpu:
    """CPU seconds this process spent outside communication: everything but the given
    thread (the worker's communication thread) and ZeroMQ's threads, i.e. the training
    thread and torch's pools. Each thread is read from its own CPU clock (``thread_cpu_s``)."""

    def __init__(self, comm: threading.Thread):
        """Raises OSError where the platform has no per-thread CPU clocks (then nothing is shared
        with the planner's model: ``TrainingCpu.available`` says whether one can be made)."""
        if not self.available():
            raise OSError("this platform has no per-thread CPU clocks or /proc/self/task")
        self._clock = time.pthread_getcpuclockid(comm.ident)

    @staticmethod
    def available() -> bool:
        return hasattr(time, "pthread_getcpuclockid") and os.path.isdir("/proc/self/task")

    def read(self) -> tuple[float, float]:
        """(training, sockets): this process's CPU seconds so far outside communication, and
        ZeroMQ's threads' (TCP and CURVE's cipher: what the bytes on the wire cost)."""
        total = time.process_time()
        try:
            comm = time.clock_gettime(self._clock)
        except OSError:  # the thread ended (the job is shutting down): nothing more to split
            comm = 0.0
        sockets = self._zmq_s()
        return total - comm - sockets, sockets

    @staticmethod
    def _zmq_s() -> float:
        return sum(cpu for (name, _), cpu in thread_cpu_s().items() if name.startswith(_ZMQ_THREADS))


def thread_cpu_s() -> dict[tuple[str, int], float]:
    """CPU seconds of each of this process's threads so far, by (name, thread id): from the
    thread's CPU clock (nanoseconds), else from /proc in clock ticks (10 ms). Ticks are too
    coarse for a short step: a few steps' training CPU, less ZeroMQ's ticks, came out 0."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        try:
            out[(name, int(tid))] = time.clock_gettime(_thread_clock(int(tid)))
        except OSError:
            try:
                stat = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[(name, int(tid))] = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return out


def _thread_clock(tid: int) -> int:
    """The CPU clock of this process's thread ``tid``, as Linux encodes it (what glibc's
    pthread_getcpuclockid returns for that thread: per-thread, scheduler time)."""
    return ((~tid) << 3) | 6
