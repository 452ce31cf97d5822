"""Test harness: a real job of separate processes on 127.0.0.1.

The scheduler binds port 0 and reports it through a file; servers bind port 0 and
announce themselves through the scheduler, so tests never fight over ports.
Workers run a Python snippet; the harness gives each process its own log and
kills whatever is left when the test ends.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

# Short heartbeats so that a lost node is noticed within a couple of seconds.
FAST = {"PS_HEARTBEAT_INTERVAL": "0.2", "PS_HEARTBEAT_TIMEOUT": "5", "GRADPRESS_CONNECT_TIMEOUT_S": "60",
        "GRADPRESS_OP_TIMEOUT_S": "60", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


class Cluster:
    def __init__(self, tmp: Path, workers: int = 2, servers: int = 1, env: dict | None = None):
        self.tmp = Path(tmp)
        self.workers, self.servers = workers, servers
        self.env = {**os.environ, **FAST, "DMLC_NUM_WORKER": str(workers), "DMLC_NUM_SERVER": str(servers),
                    "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_NODE_HOST": "127.0.0.1", **(env or {})}
        self.procs: dict[str, subprocess.Popen] = {}
        self.port = 0

    def start_scheduler(self) -> None:
        port_file = self.tmp / "port"
        self._spawn("scheduler", [sys.executable, "-m", "gradpress.launcher"],
                    DMLC_ROLE="scheduler", DMLC_PS_ROOT_PORT="0", GRADPRESS_PORT_FILE=str(port_file))
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert time.monotonic() < deadline, "scheduler did not report its port:\n" + self.log("scheduler")
            assert self.procs["scheduler"].poll() is None, "scheduler died:\n" + self.log("scheduler")
            time.sleep(0.02)
        self.port = int(port_file.read_text())

    def start(self, worker_code: str, worker_env: dict | None = None) -> "Cluster":
        """Start scheduler, servers and workers; ``worker_code`` runs in every worker."""
        self.start_scheduler()
        for i in range(self.servers):
            self._spawn(f"server {i}", [sys.executable, "-m", "gradpress.launcher"], DMLC_ROLE="server")
        script = self.tmp / "worker.py"
        script.write_text(textwrap.dedent(worker_code))
        for i in range(self.workers):
            self._spawn(f"worker {i}", [sys.executable, str(script)], DMLC_ROLE="worker",
                        DMLC_WORKER_ID=str(i), GP_TEST_DIR=str(self.tmp), **(worker_env or {}))
        return self

    def _spawn(self, name: str, cmd: list[str], **env) -> None:
        log = open(self.tmp / f"{name.replace(' ', '_')}.log", "wb")
        self.procs[name] = subprocess.Popen(cmd, env={**self.env, "DMLC_PS_ROOT_PORT": str(self.port), **env},
                                            stdout=log, stderr=subprocess.STDOUT)

    def log(self, name: str) -> str:
        path = self.tmp / f"{name.replace(' ', '_')}.log"
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
