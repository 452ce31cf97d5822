"""The end of a job (issue 14): the scheduler exits only once every member acknowledged
SHUTDOWN, within a deadline, and a member that heard SHUTDOWN never reports the scheduler lost."""
import signal
import time

import pytest

pytestmark = pytest.mark.integ

# A few rounds, then wait for the test's word before finishing.
WORKER = """
import os, time, numpy as np
from pathlib import Path
from gradpress.config import Settings
from gradpress.worker import WorkerClient
c = WorkerClient(Settings.load(os.environ))
c.start()
d = Path(os.environ["GP_TEST_DIR"])
for rnd in range(3):
    out = np.empty(1000, np.float32)
    c.push_pull_async("t", np.full(1000, float(rnd), np.float32), out, 1, 0).result(30)
    assert np.all(out == rnd * c.size), out[:3]
(d / f"ready{c.rank}").write_text("")
while not (d / "go").exists():
    time.sleep(0.02)
c.finish()
print("finished", c.rank, flush=True)
"""


def _wait_for(condition, timeout_s: float, what: str, logs=lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s\n{logs()}")
        time.sleep(0.02)


def _finish_with_a_stopped_server(c, stopped_s: float) -> bool:
    """Stop the server (SIGSTOP: it reads nothing), let the workers finish, and resume it
    ``stopped_s`` seconds later. Returns whether the scheduler was still running then."""
    _wait_for(lambda: all((c.tmp / f"ready{r}").exists() for r in (0, 1)), 60, "workers ready", c.logs)
    server, scheduler = c.procs["server 0"], c.procs["scheduler"]
    server.send_signal(signal.SIGSTOP)
    try:
        (c.tmp / "go").write_text("")
        time.sleep(stopped_s)
        scheduler_alive = scheduler.poll() is None
    finally:
        server.send_signal(signal.SIGCONT)
    c.assert_success(60)
    return scheduler_alive


def _assert_nobody_lost_the_scheduler(c) -> None:
    for name in c.procs:
        assert "lost scheduler" not in c.log(name), f"{name} reported the scheduler lost\n{c.logs()}"


def test_the_scheduler_waits_for_a_slow_members_acknowledgement(cluster):
    c = cluster(workers=2, servers=1).start(WORKER)
    assert _finish_with_a_stopped_server(c, stopped_s=2.0), \
        f"the scheduler exited while the server had not acknowledged SHUTDOWN\n{c.logs()}"
    _assert_nobody_lost_the_scheduler(c)
    assert "without the SHUTDOWN acknowledgement" not in c.log("scheduler"), c.log("scheduler")


def test_a_member_that_never_acknowledges_is_named_and_still_exits_cleanly(cluster):
    c = cluster(workers=2, servers=1, env={"PS_HEARTBEAT_TIMEOUT": "1.5"}).start(WORKER)
    scheduler_alive = _finish_with_a_stopped_server(c, stopped_s=4.0)
    assert not scheduler_alive, "the scheduler waited past its deadline (PS_HEARTBEAT_TIMEOUT)"
    log = c.log("scheduler")
    assert "without the SHUTDOWN acknowledgement of server 0 within PS_HEARTBEAT_TIMEOUT=1.5 s" in log, log
    _assert_nobody_lost_the_scheduler(c)  # the server, resumed after the scheduler left, exits 0
