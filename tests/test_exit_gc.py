"""A node's exit without Python's final garbage collections (gradpress/exit_gc.py)."""
import subprocess
import sys

import pytest

from gradpress.config import Settings

pytestmark = pytest.mark.integ  # every test starts a process

# An object that only its own reference cycle keeps alive at exit says so if finalized.
# The collector is off so that nothing collects it before the exit does.
HELD = """
import gc, os
class Held:
    def __del__(self):
        os.write(1, b"FINALIZED\\n")
def hold():
    gc.disable()
    held = Held(); held.me = held
"""

# the node's own shutdown at exit must still find a working collector; the cycle is made after
PROCESS = HELD + """
from gradpress import exit_gc
from gradpress.config import Settings
class Cycle:
    pass
def shutdown():
    c = Cycle(); c.me = c; del c
    print("SHUTDOWN COLLECTED", gc.collect(), flush=True)
    hold()
exit_gc.configure(Settings.load(), shutdown)
"""


def run(env: dict) -> str:
    out = subprocess.run([sys.executable, "-c", PROCESS], capture_output=True, text=True, timeout=60,
                         env={**env, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_exit_skips_the_final_collections_after_the_nodes_own_shutdown():
    out = run({})
    assert "SHUTDOWN COLLECTED" in out and "SHUTDOWN COLLECTED 0" not in out, out
    assert "FINALIZED" not in out, "the exit still collected a cycle"


def test_at_0_the_exit_is_pythons_own():
    assert Settings.load({"GRADPRESS_EXIT_SKIP_GC": "0"}).exit_skip_gc is False
    assert "FINALIZED" in run({"GRADPRESS_EXIT_SKIP_GC": "0"})


WORKER = """
import torch, gradpress.torch as bps
bps.init()
assert torch.equal(bps.push_pull(torch.ones(3), average=False, name="x"), torch.full((3,), 2.0))
bps.shutdown()
""" + HELD + "hold()\n"


def test_a_worker_exits_without_them_unless_told_not_to(cluster):
    """One job: worker 0 with the default, worker 1 with the setting at 0."""
    c = cluster(workers=2, servers=1).start(WORKER, each_worker=[{}, {"GRADPRESS_EXIT_SKIP_GC": "0"}])
    c.assert_success()
    assert "FINALIZED" not in c.log("worker 0")
    assert "FINALIZED" in c.log("worker 1")
