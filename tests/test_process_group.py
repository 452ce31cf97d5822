"""gradpress-launch's process group when one of its processes dies: the others get twice
PS_HEARTBEAT_TIMEOUT to stop by themselves before they are stopped. Stand-ins for the
processes: a server killed is found by the scheduler only at its silence (one heartbeat
timeout), and the workers then take a moment to say so and exit; with one timeout of grace
the launcher stopped them first, and their last lines and exit codes were never shown."""
import time

from gradpress.processes import ProcessGroup

HEARTBEAT = {"PS_HEARTBEAT_TIMEOUT": "0.4", "PS_HEARTBEAT_INTERVAL": "0.1"}


class _Exits:
    """A process that exits with ``code`` ``after_s`` seconds from now (None: never, until stopped)."""

    def __init__(self, code, after_s=None):
        self.code, self.at = code, None if after_s is None else time.monotonic() + after_s
        self.returncode = None
        self.signals = []
        self.pid = 0  # (its launcher's report to a scheduler: none here, none reachable)

    def poll(self):
        if self.returncode is None and self.at is not None and time.monotonic() >= self.at:
            self.returncode = self.code
        return self.returncode

    def send_signal(self, signum):
        self.signals.append(signum)
        self.returncode = -signum

    def wait(self, timeout=None):
        return self.poll()

    def kill(self):
        self.send_signal(9)


def test_the_others_stop_by_themselves_after_a_heartbeat_timeout_and_are_reported(capsys):
    group = ProcessGroup()
    group.procs = {"scheduler": _Exits(1, 0.45), "server 0": _Exits(-9, 0.0), "worker 0": _Exits(1, 0.6),
                   "worker 1": _Exits(1, 0.65)}
    group.envs = {name: dict(HEARTBEAT) for name in group.procs}
    time.sleep(0.01)
    # the killed server's signal: it is the cause, the workers' 1 its consequence (it was the
    # first worker's code, and a job whose server was killed exited 1)
    assert group._fail("server 0", group.procs["server 0"], -9) == 137
    err = capsys.readouterr().err
    assert "worker 0 exited with code 1" in err and "worker 1 exited with code 1" in err, err
    assert not group.procs["worker 0"].signals and not group.procs["worker 1"].signals


def test_one_that_never_stops_is_stopped_after_the_grace():
    group = ProcessGroup()
    group.procs = {"server 0": _Exits(-9, 0.0), "worker 0": _Exits(1)}
    group.envs = {name: dict(HEARTBEAT) for name in group.procs}
    started = time.monotonic()
    assert group._fail("server 0", group.procs["server 0"], -9) == 137  # the server's signal
    assert 0.8 <= time.monotonic() - started < 3 and group.procs["worker 0"].signals
