"""Test harness: a real job of separate processes on 127.0.0.1.

The processes start through the launcher's own code (``gradpress.launcher.LocalJob``,
what ``gradpress-launch --local`` runs), so tests start jobs the way users do. The
scheduler binds port 0 and reports it through a file; servers bind port 0 and
announce themselves through the scheduler, so tests never fight over ports. Workers
run a Python snippet; each process writes its own log, and the harness kills
whatever is left when the test ends.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from gradpress.launcher import LocalJob
from gradpress.processes import ProcessGroup

# Short heartbeats so that a lost node is noticed within a couple of seconds.
FAST = {"PS_HEARTBEAT_INTERVAL": "0.2", "PS_HEARTBEAT_TIMEOUT": "5", "GRADPRESS_CONNECT_TIMEOUT_S": "60",
        "GRADPRESS_OP_TIMEOUT_S": "60", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


# The job secret of in-process tests' sockets (a LocalCluster's job makes its own).
TEST_SECRET = secrets.token_hex(32)


class LocalCluster:
    """One job's processes, their logs under ``tmp``, and the checks tests make on them."""

    def __init__(self, tmp: Path, workers: int = 2, servers: int = 1, env: dict | None = None):
        self.tmp = Path(tmp)
        self.group = ProcessGroup(log_dir=str(self.tmp))
        self.job = LocalJob(workers, servers, {**os.environ, **FAST, **(env or {})}, self.group)

    @property
    def procs(self) -> dict[str, subprocess.Popen]:
        return self.group.procs

    @property
    def port(self) -> int:
        return self.job.port

    @property
    def secret(self) -> str:
        """The job secret its processes got (the launcher made it)."""
        return self.job.env["GRADPRESS_JOB_SECRET"]

    def start_scheduler(self) -> None:
        try:
            self.job.start_scheduler(str(self.tmp / "port"))
        except RuntimeError as e:
            raise AssertionError(f"{e}:\n{self.log('scheduler')}") from None

    def start_server(self, index: int, **env: str) -> None:
        self.job.start_server(index, **env)

    def start_worker(self, index: int, command: list[str], **env: str) -> None:
        self.job.start_worker(index, command, **env)

    def start(self, worker_code: str, worker_env: dict | None = None,
              each_worker: list[dict] | None = None) -> "LocalCluster":
        """Start scheduler, servers and workers; ``worker_code`` runs in every worker, with
        ``worker_env`` and worker i's own ``each_worker[i]``."""
        self.start_scheduler()
        for i in range(self.job.servers):
            self.start_server(i)
        script = self.tmp / "worker.py"
        script.write_text(textwrap.dedent(worker_code))
        for i in range(self.job.workers):
            own = each_worker[i] if each_worker else {}
            self.start_worker(i, [sys.executable, str(script)], GP_TEST_DIR=str(self.tmp), **(worker_env or {}), **own)
        return self

    def start_machines(self, worker_code: str, local_size: int, worker_env: dict | None = None) -> "LocalCluster":
        """As ``start``, with ``local_size`` worker processes per machine (the job's workers
        count machines): process ``worker r`` is local rank ``r % local_size`` of machine
        ``r // local_size``."""
        self.start_scheduler()
        for i in range(self.job.servers):
            self.start_server(i)
        script = self.tmp / "worker.py"
        script.write_text(textwrap.dedent(worker_code))
        for r in range(self.job.workers * local_size):
            self.start_worker(r, [sys.executable, str(script)], GP_TEST_DIR=str(self.tmp),
                              DMLC_WORKER_ID=str(r // local_size), BYTEPS_LOCAL_RANK=str(r % local_size),
                              BYTEPS_LOCAL_SIZE=str(local_size), **(worker_env or {}))
        return self

    def log(self, name: str) -> str:
        path = Path(self.group.log_path(name))
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"----- {n} (exit {p.poll()}) -----\n{self.log(n)}" for n, p in self.procs.items())

    def wait(self, timeout_s: float = 120) -> dict[str, int]:
        """Exit codes of every process; kills them all if the deadline passes."""
        deadline = time.monotonic() + timeout_s
        for name, p in self.procs.items():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"{name} still running after {timeout_s} s\n{self.logs()}")
        return {n: p.returncode for n, p in self.procs.items()}

    def assert_success(self, timeout_s: float = 120) -> None:
        codes = self.wait(timeout_s)
        assert all(c == 0 for c in codes.values()), f"exit codes {codes}\n{self.logs()}"

    def kill(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()


def job_leftovers(pids: set[int]) -> list[str]:
    """What the job's processes left: files in /dev/shm, or mappings of their memfds anywhere."""
    tags = {f"gradpress-{role}{pid}" for pid in pids for role in "ws"}
    left = [str(p) for p in Path("/dev/shm").glob("gradpress-*") if any(p.name.startswith(t) for t in tags)]
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            maps = (proc / "maps").read_text()
        except OSError:
            continue
        left += [f"{proc.name}: {line}" for line in maps.splitlines() if any(f"memfd:{t} " in line + " " for t in tags)]
    return left
