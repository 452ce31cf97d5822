"""Health file for liveness and readiness probes, and the ``gradpress-health`` command.

A node writes the file once it has registered with the scheduler (ready) and
touches it on every pass of its poll loop (alive). Probes check that the file
exists and that its modification time is recent: a wedged loop stops touching it.
A node that has left its job (a worker after ``shutdown()``, which may go on to save
or evaluate) writes it as finished: alive for as long as its process runs.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time

FINISHED = "finished"  # the file's first word once the node has left its job


class HealthFile:
    """Writes ``path`` when ready and refreshes its mtime on each beat; no-op without a path."""

    def __init__(self, path: str, min_beat_interval_s: float = 1.0):
        self.path = path
        self._interval = min_beat_interval_s
        self._last = 0.0
        self._ready = False
        if path:
            with contextlib.suppress(FileNotFoundError):  # (a pod's other processes remove it too)
                os.unlink(path)  # a stale file from an earlier run must not count as ready

    def ready(self, description: str) -> None:
        self._write(f"ready {description}")
        self._ready = bool(self.path)

    def finished(self, description: str) -> None:
        """The node left its job: its loop no longer beats, and the probes must not take that
        for a wedged loop (a Job's worker pod killed after training would fail the whole Job)."""
        if self._ready:
            self._write(f"{FINISHED} {description}")
            self._ready = False

    def beat(self) -> None:
        now = time.monotonic()
        if self._ready and now - self._last >= self._interval:
            self._last = now
            os.utime(self.path)

    def _write(self, line: str) -> None:
        if not self.path:
            return
        # a temporary file of this writer's own: a pod's training processes share one health
        # file (gradpress-launch starts one per GPU) and write it at the same moment
        tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as fh:
            fh.write(line + "\n")
        os.replace(tmp, self.path)


def container_start() -> float | None:
    """When PID 1 of this PID namespace started (wall clock, to the second), or None where
    /proc cannot say. In a container that is the container's start: a health file older than
    it was left by the container before a restart (its emptyDir outlives the container)."""
    try:
        with open("/proc/stat") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
        with open("/proc/1/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gradpress-health",
                                description="Exit 0 if this node is registered (ready) or its loop is alive (live).")
    p.add_argument("check", choices=("ready", "live"))
    p.add_argument("--file", default=os.environ.get("GRADPRESS_HEALTH_FILE", ""),
                   help="health file (default: $GRADPRESS_HEALTH_FILE)")
    p.add_argument("--max-age", type=float, default=30.0,
                   help="live: the file must have been touched within this many seconds")
    args = p.parse_args(argv)
    if not args.file:
        print("gradpress-health: no health file (set GRADPRESS_HEALTH_FILE or --file)", file=sys.stderr)
        return 2
    try:
        mtime = os.stat(args.file).st_mtime
        with open(args.file) as fh:
            state = fh.read(64).split(maxsplit=1)[:1]
    except FileNotFoundError:
        print(f"gradpress-health: {args.file} does not exist: not registered yet", file=sys.stderr)
        return 1
    started = container_start()
    if started is not None and mtime < started + 1:  # btime has whole seconds: within one is stale too
        print(f"gradpress-health: {args.file} was last written before this container started "
              f"(left by an earlier run): not registered yet", file=sys.stderr)
        return 1
    age = time.time() - mtime
    if args.check == "live" and age > args.max_age and state != [FINISHED]:
        print(f"gradpress-health: {args.file} last touched {age:.1f} s ago (> {args.max_age} s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
