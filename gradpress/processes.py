"""A group of child processes for ``gradpress-launch``: output prefixed with each one's
name (or written to a log file each), and one failure stops them all, a failed worker
reported to the job's scheduler first so that every node names it."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

from .config import Settings
from .errors import Terminated

STOP_GRACE_S = 5.0


def raise_on_termination() -> None:
    """SIGTERM and SIGHUP raise ``Terminated`` in the main thread. Why: a launcher that is a
    container's entrypoint is PID 1, which the kernel never kills for a signal it has no
    handler for, so a deleted pod waited out its grace period for SIGKILL, its training
    never told; elsewhere the launcher died at once and left children that ignore SIGTERM."""
    def terminated(signum, _frame):
        raise Terminated(signum)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, terminated)


class ProcessGroup:
    """Child processes whose output is prefixed with their name; one failure stops all.

    Args:
        log_dir: if given, each process writes its output to ``<log_dir>/<name>.log``
            (spaces in the name become ``_``) instead of to this process's output.
    """

    def __init__(self, log_dir: str | None = None):
        self.procs: dict[str, subprocess.Popen] = {}
        self.envs: dict[str, dict] = {}
        self.readers: list[threading.Thread] = []
        self.log_dir = log_dir
        self._print = threading.Lock()

    @property
    def names(self) -> list[str]:
        return list(self.procs)

    def log_path(self, name: str) -> str:
        return os.path.join(self.log_dir or "", f"{name.replace(' ', '_')}.log")

    def start(self, name: str, cmd: list[str], env: dict, prefix: bool = True) -> None:
        # a name of its own, which it registers with and the report of its exit gives
        env = dict(env, GRADPRESS_LAUNCH_ID=uuid.uuid4().hex)
        self.envs[name] = env
        if self.log_dir is not None:
            with open(self.log_path(name), "wb") as log:  # the child keeps its own descriptor
                self.procs[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                    preexec_fn=_die_with_parent)
            return
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE if prefix else None,
                                stderr=subprocess.STDOUT if prefix else None, preexec_fn=_die_with_parent)
        self.procs[name] = proc
        if prefix:
            t = threading.Thread(target=self._relay, args=(name, proc), daemon=True)
            t.start()
            self.readers.append(t)

    def _relay(self, name: str, proc: subprocess.Popen) -> None:
        for line in iter(proc.stdout.readline, b""):
            with self._print:
                sys.stdout.write(f"[{name}] {line.decode(errors='replace')}")
                sys.stdout.flush()

    def wait(self, essential: list[str]) -> int:
        """Wait until the essential processes (and then the rest) exit; stop all on a failure."""
        try:
            while True:
                for name, proc in self.procs.items():
                    code = proc.poll()
                    if code not in (None, 0):
                        self._say(f"{name} exited with code {code}; stopping the job")
                        return self._fail(name, proc, code)
                if all(self.procs[n].poll() == 0 for n in essential):
                    break
                time.sleep(0.1)
            # the workers are done: scheduler and servers end once they hear so
            deadline = time.monotonic() + 30
            while any(p.poll() is None for p in self.procs.values()) and time.monotonic() < deadline:
                time.sleep(0.1)
            late = [n for n, p in self.procs.items() if p.poll() is None]
            failed = [n for n, p in self.procs.items() if p.poll() not in (None, 0)]
            if late or failed:
                self._say(f"after the workers finished: still running {late}, failed {failed}"
                          + (" (a worker that exits without init() leaves them waiting for it to join)"
                             if late else ""))
                self.stop()
                return 1
            return 0
        except KeyboardInterrupt:
            self.stop()
            return 130
        except Terminated as e:
            self._say(f"{e}; stopping the job")
            self.stop()
            return e.status
        finally:
            for t in self.readers:
                t.join(timeout=2)

    def _fail(self, name: str, proc: subprocess.Popen, code: int) -> int:
        """``name`` exited with ``code``: report a worker's or server's failure to the scheduler,
        give the others twice PS_HEARTBEAT_TIMEOUT to stop by themselves (each saying why; the
        scheduler lingers after a failure and is not waited for), then stop what is left. (Where
        the scheduler cannot be told, a dead node is found at its silence, one heartbeat timeout;
        then each node takes its own moments to say so and exit, which one timeout cut short.)

        Returns:
            128 + the signal where ``name`` was killed by one, as shells say; else the exit
            code of the first worker seen failing (of ``name`` if no worker failed).
        """
        first = [(name, code)]
        try:
            grace_s = 2 * Settings.load(self.envs.get(name, os.environ)).heartbeat_timeout_s
        except ValueError:
            grace_s = STOP_GRACE_S
        if name.startswith(("worker", "server")) and name in self.envs:
            _report_exit(proc, self.envs[name], code, name.split()[0])
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(
                p.poll() is None for n, p in self.procs.items() if n != "scheduler"):
            time.sleep(0.05)
        for other, p in self.procs.items():
            if other != name and p.poll() not in (None, 0):
                self._say(f"{other} exited with code {p.returncode}")
                first.append((other, p.returncode))
        self.stop()
        # a process killed by a signal is the cause (nothing in the job kills another before
        # stop()); else a worker's own code, not the 1 of the nodes stopped because of it
        culprit = code if code < 0 else next((c for n, c in first if n.startswith("worker")), code)
        return culprit if culprit > 0 else 128 - culprit

    def stop(self) -> None:
        """SIGTERM to every process still running; SIGKILL to those left after STOP_GRACE_S,
        or at once on a second interrupt or termination (which used to skip it)."""
        try:
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for proc in self.procs.values():
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        except (KeyboardInterrupt, Terminated):
            pass  # no more grace
        finally:
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def _say(self, text: str) -> None:
        with self._print:
            print(f"gradpress-launch: {text}", file=sys.stderr, flush=True)


def _report_exit(proc: subprocess.Popen, env: dict, code: int, role: str) -> None:
    """Tell the job's scheduler that this worker or server process exited with ``code``
    (ABORT), so that every other node stops at once, naming it (a no-op if it said so
    itself); a server killed outright was found at its silence, one heartbeat timeout later."""
    from .worker.abort import report_failure  # here: the worker package is heavy for a launcher to import
    try:
        settings = Settings.load(env)
    except ValueError:
        return
    how = f"exited with code {code}" if code > 0 else f"was killed by signal {-code}"
    report_failure(settings, "launcher", how, pid=proc.pid, worker_id=settings.worker_id if role == "worker" else -1,
                   local_rank=settings.local_rank, wait_s=min(2.0, settings.heartbeat_timeout_s), role=role,
                   launch=settings.launch_id)


def _die_with_parent() -> None:
    """Children get SIGTERM if the launcher dies, so a killed launcher leaves nothing behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
