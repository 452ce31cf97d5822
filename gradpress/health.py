"""Health file for liveness and readiness probes, and the ``gradpress-health`` command.

A node writes the file once it has registered with the scheduler (ready) and
touches it on every pass of its poll loop (alive). Probes check that the file
exists and that its modification time is recent: a wedged loop stops touching it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


class HealthFile:
    """Writes ``path`` when ready and refreshes its mtime on each beat; no-op without a path."""

    def __init__(self, path: str, min_beat_interval_s: float = 1.0):
        self.path = path
        self._interval = min_beat_interval_s
        self._last = 0.0
        self._ready = False
        if path and os.path.exists(path):
            os.unlink(path)  # a stale file from an earlier run must not count as ready

    def ready(self, description: str) -> None:
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as fh:
            fh.write(description + "\n")
        os.replace(tmp, self.path)
        self._ready = True

    def beat(self) -> None:
        now = time.monotonic()
        if self._ready and now - self._last >= self._interval:
            self._last = now
            os.utime(self.path)


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
        age = time.time() - os.stat(args.file).st_mtime
    except FileNotFoundError:
        print(f"gradpress-health: {args.file} does not exist: not registered yet", file=sys.stderr)
        return 1
    if args.check == "live" and age > args.max_age:
        print(f"gradpress-health: {args.file} last touched {age:.1f} s ago (> {args.max_age} s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
