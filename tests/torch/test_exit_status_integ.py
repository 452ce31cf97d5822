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
client = types.SimpleNamespace(aborted=False, fatal={fatal}, raised={raised})
def shutdown():
    {shutdown}
atexit.register(failures.leave_at_exit(shutdown, lambda: client))
print("script done", flush=True)
"""


@pytest.mark.parametrize("fatal, raised, shutdown, code, said", [
    ("None", "None", "raise NodeLostError('worker 1: lost worker 0: failed: boom')", 1, "lost worker 0"),
    # the communication thread ended on an error after the script's last call: finish() returns
    ("NodeLostError('worker 1: lost scheduler 0: no heartbeat for 3.0 s')", "None", "pass", 1, "lost scheduler 0"),
    # a push_pull raised, in a thread of the script that died of it, or caught: the job failed
    ("None", "NodeLostError('worker 1: round 3: worker 0 finished')", "pass", 1, "worker 0 finished"),
    ("None", "None", "raise OpTimeoutError('shutdown (waiting for every worker to finish)')", 0, "waiting for every"),
    ("None", "None", "pass", 0, ""),
])
def test_the_exit_status_says_whether_the_job_failed(fatal, raised, shutdown, code, said):
    script = textwrap.dedent(SCRIPT).format(fatal=fatal, raised=raised, shutdown=shutdown)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == code, run
    assert "script done" in run.stdout and said in run.stderr, run
    assert not os.path.exists(run.stdout.split()[0]), "a handler registered before gradpress's did not run"


def test_a_push_pull_that_raises_the_jobs_failure_is_noted_on_the_client(monkeypatch):
    # the exit status reads it: a training thread that died of it left the main thread's exit clean
    import types
    from gradpress.errors import JobError
    from gradpress.torch import failures, handles
    from gradpress.worker.future import Future
    client = types.SimpleNamespace(raised=None)
    monkeypatch.setattr(handles, "on_raised", handles.on_raised)  # (put back after the test)
    failures.note_raised_on(lambda: client)
    future = Future("push_pull of tensor 'w'")
    future.fail(JobError("push_pull of tensor 'w': server 0: worker 1 finished"))
    handle = handles.register(handles.Pending(future, None, None, None))
    with pytest.raises(JobError):
        handles.wait(handle, 1)
    assert str(client.raised) == "push_pull of tensor 'w': server 0: worker 1 finished"
