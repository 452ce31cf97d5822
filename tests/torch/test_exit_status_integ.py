"""A worker that leaves its job at exit (its script never called ``shutdown()``) exits 1
where the job failed: Python ignores an exit handler's exception and exits 0, so a failed
job's worker pod reported success. Its deadline waiting for slower workers stays a warning,
and the standard library's clean-up registered before it still runs."""
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integ  # (each case is a process of its own: its exit status is the point)
SCRIPT = """
import atexit, tempfile, types
kept = tempfile.TemporaryDirectory()  # its removal is an exit handler registered before gradpress's
print(kept.name, flush=True)
from gradpress.errors import NodeLostError, OpTimeoutError
from gradpress.torch import failures
client = types.SimpleNamespace(aborted=False, fatal={fatal})
def shutdown():
    {shutdown}
atexit.register(failures.leave_at_exit(shutdown, lambda: client))
print("script done", flush=True)
"""


@pytest.mark.parametrize("fatal, shutdown, code, said", [
    ("None", "raise NodeLostError('worker 1: lost worker 0: failed: boom')", 1, "lost worker 0"),
    # the communication thread ended on an error after the script's last call: finish() returns
    ("NodeLostError('worker 1: lost scheduler 0: no heartbeat for 3.0 s')", "pass", 1, "lost scheduler 0"),
    ("None", "raise OpTimeoutError('shutdown (waiting for every worker to finish)')", 0, "waiting for every"),
    ("None", "pass", 0, ""),
])
def test_the_exit_status_says_whether_the_job_failed(fatal, shutdown, code, said):
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT).format(fatal=fatal, shutdown=shutdown)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == code, run
    assert "script done" in run.stdout and said in run.stderr, run
    assert not os.path.exists(run.stdout.split()[0]), "a handler registered before gradpress's did not run"
