"""Network partitions, not process deaths: the server's link goes down mid-training (the
bridge port of its namespace), so its peers see no FIN or RST, only silence.

- Cut for good: every process of the job must stop within the heartbeat timeout, each
  naming what it lost: the scheduler and the workers the server, the server (cut off from
  everyone) the scheduler.
- Cut for less than the timeout (a flap): TCP carries what was in flight once the link is
  back, and the job goes on to its end, every sum exact.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from netns_job import start_job

from gradpress.testing import netns

pytestmark = [pytest.mark.integ, pytest.mark.netns]
TIMEOUT_S = 5  # FAST's PS_HEARTBEAT_TIMEOUT
TRAIN = """
import os, sys, time, torch, gradpress.torch as bps
bps.init()
x = torch.full((100000,), float(bps.rank() + 1))
for step in range(int(sys.argv[1])):
    y = bps.push_pull(x.clone(), name="x", average=False)
    assert bool((y == 3).all()), f"step {step}: a wrong sum"
    if step == 3:
        open(os.path.join(os.environ["GP_TEST_DIR"], f"ready{bps.rank()}"), "w").close()
    time.sleep(0.02)
"""


def _start(namespaces, tmp_path: Path, steps: int) -> dict:
    """The job, once both workers have made 4 steps."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    procs = start_job(namespaces, [sys.executable, str(script), str(steps)], tmp_path, {})
    deadline = time.monotonic() + 90
    while not all((tmp_path / f"ready{r}").exists() for r in range(2)):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs.values()):
            _kill(procs)
            raise AssertionError(_logs(procs, tmp_path))
        time.sleep(0.1)
    return procs


def _logs(procs: dict, tmp_path: Path) -> str:
    return "\n".join(f"--- {n}\n{(tmp_path / f'{n}.log').read_text(errors='replace')[-2500:]}" for n in procs)


def _kill(procs: dict) -> None:
    for p in procs.values():
        if p.poll() is None:
            p.kill()


def _link(namespaces, node: str, state: str) -> None:
    netns.ip("-n", namespaces.switch, "link", "set", namespaces.nodes[node][2], state)


def test_a_server_cut_off_by_the_network_stops_every_process_naming_it(namespaces, tmp_path):
    procs = _start(namespaces, tmp_path, 100000)

    def logs() -> str:
        return _logs(procs, tmp_path)
    try:
        _link(namespaces, "s0", "down")
        cut = time.monotonic()
        stopped = {}
        while len(stopped) < len(procs) and time.monotonic() - cut < 6 * TIMEOUT_S:
            stopped.update({n: time.monotonic() - cut for n, p in procs.items()
                            if n not in stopped and p.poll() is not None})
            time.sleep(0.1)
        running = set(procs) - set(stopped)
        assert not running, f"still running after {6 * TIMEOUT_S} s: {running}\n{logs()}"
        # each one at its own heartbeat deadline, plus the time to pass the word on and exit
        assert max(stopped.values()) < 3 * TIMEOUT_S, f"{stopped}\n{logs()}"
        assert all(p.returncode != 0 for p in procs.values()), logs()
        for name in ("sched", "w0", "w1"):
            assert "lost server 0" in (tmp_path / f"{name}.log").read_text(), logs()
        assert "server 0: lost scheduler 0" in (tmp_path / "s0.log").read_text(), logs()
    finally:
        _kill(procs)


def test_a_link_down_for_less_than_the_timeout_loses_nothing(namespaces, tmp_path):
    procs = _start(namespaces, tmp_path, 150)
    try:
        _link(namespaces, "s0", "down")
        # 1 s: TCP's retransmission timer doubles from 0.2 s, so the first one after the link is
        # back comes about 1.4 s after the cut, well inside the timeout (a cut of 2.5 s would wait
        # for the one at about 3 s; the same job survived that too when probed by hand)
        time.sleep(1.0)
        _link(namespaces, "s0", "up")
        codes = {n: p.wait(timeout=60) for n, p in procs.items()}
        assert all(code == 0 for code in codes.values()), f"{codes}\n{_logs(procs, tmp_path)}"
    finally:
        _kill(procs)
