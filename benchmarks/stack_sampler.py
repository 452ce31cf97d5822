"""Where a process's threads spend their time, without a profiler on the machine: a daemon
thread samples every thread's stack every few milliseconds and counts, per thread, the
innermost frame of the project (``gradpress/``) and the innermost frame overall.

    sampler = StackSampler(); sampler.start(); ...; sampler.report(path, title)

Used by ``benchmarks/gpu.py --profile`` on the lent GPU machine, where py-spy is absent."""
from __future__ import annotations

import collections
import sys
import threading
import time


class StackSampler:
    def __init__(self, interval_s: float = 0.002, marker: str = "gradpress/"):
        self.interval_s, self.marker = interval_s, marker
        self.counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        me = threading.get_ident()
        names = {}
        while not self._stop.wait(self.interval_s):
            self.samples += 1
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                if ident not in names:
                    names = {t.ident: t.name for t in threading.enumerate()}
                leaf, ours = _where(frame), None
                f = frame
                while f is not None and ours is None:
                    if self.marker in f.f_code.co_filename:
                        ours = _where(f)
                    f = f.f_back
                self.counts[names.get(ident, str(ident))][f"{ours or '-'}  <  {leaf}"] += 1

    def report(self, path: str, title: str, top: int = 12) -> None:
        self._stop.set()
        self._thread.join(timeout=1)
        with open(path, "a") as fh:
            fh.write(f"== {title}: {self.samples} samples every {self.interval_s * 1e3:.0f} ms\n")
            for thread, counter in sorted(self.counts.items()):
                total = sum(counter.values())
                fh.write(f"-- thread {thread}: {total}\n")
                for where, n in counter.most_common(top):
                    fh.write(f"{100 * n / total:5.1f}%  {where}\n")


def _where(frame) -> str:
    name = frame.f_code.co_filename
    return f"{name[name.rfind('/', 0, name.rfind('/')) + 1:]}:{frame.f_lineno} {frame.f_code.co_name}"


if __name__ == "__main__":  # a self-check: the sampler sees a busy thread where it is busy
    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    s = StackSampler()
    s.start()
    t = threading.Thread(target=spin, args=(0.3,), name="busy")
    t.start()
    t.join()
    s.report("/dev/stdout", "self-check")
