"""An unexpected exception in a server's work on one key (gradpress/server/engine.py): that
key's round fails with an ERROR to every worker in it, naming the server, the tensor, the key
and the exception; the job stops within its deadline and nothing hangs; the server's other
keys were served until then. The fault is injected into a real server process through a
``sitecustomize`` module on its path; on an engine thread and on the I/O thread's own engine."""
import os
import sys

import pytest

from cluster import LocalCluster

pytestmark = pytest.mark.integ

INJECT = """
import gradpress.server.store as store
_push = store.KeyState.push
def push(self, sender, rnd, values, lr=None):
    if self.name == "boom" and rnd == 1:
        raise RuntimeError("injected engine fault")
    return _push(self, sender, rnd, values, lr)
store.KeyState.push = push
"""

WORKER = """
import os, torch, gradpress.torch as bps
bps.init()
x, y = torch.ones(int(os.environ["GP_N"])), torch.ones(10)
bps.push_pull_inplace(x.clone(), name="boom")            # round 0: fine
assert torch.equal(bps.push_pull_inplace(y, average=False, name="fine"), torch.full((10,), 2.0))
try:
    bps.push_pull_inplace(x.clone(), name="boom")        # round 1: the server's work raises
    print("NO ERROR", flush=True)
except Exception as e:
    with open(os.path.join(os.environ["GP_TEST_DIR"], f"error{bps.rank()}"), "w") as fh:
        fh.write(f"{type(e).__name__}: {e}")
    raise
"""


@pytest.mark.parametrize("engine_threads,n", [(2, 40000), (0, 1000)], ids=["engine-thread", "io-thread"])
def test_an_exception_in_a_keys_work_fails_its_round_naming_server_key_and_exception(tmp_path, engine_threads, n):
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(INJECT)
    c = LocalCluster(tmp_path, workers=2, servers=1, env={"BYTEPS_SERVER_ENGINE_THREAD": str(engine_threads)})
    try:
        c.start_scheduler()
        c.start_server(0, PYTHONPATH=os.pathsep.join([str(tmp_path / "inject"), *sys.path]))
        script = tmp_path / "worker.py"
        script.write_text(WORKER)
        for i in range(2):
            c.start_worker(i, [sys.executable, str(script)], GP_TEST_DIR=str(tmp_path), GP_N=str(n))
        codes = c.wait(timeout_s=60)
    finally:
        c.kill()
    assert codes["worker 0"] != 0 and codes["worker 1"] != 0, codes
    errors = [(tmp_path / f"error{w}").read_text() for w in range(2) if (tmp_path / f"error{w}").exists()]
    assert errors, f"no worker's push_pull failed\n{c.logs()}"
    for w in range(2):  # each worker stops with the message: its own push_pull's, or the job's end
        told = (tmp_path / f"error{w}").read_text() if (tmp_path / f"error{w}").exists() else c.log(f"worker {w}")
        for needed in ("tensor 'boom'", "key ", "RuntimeError: injected engine fault", "server 0"):
            assert needed in told, f"worker {w}: {needed!r} not in what it was told:\n{told}"
        assert "NO ERROR" not in c.log(f"worker {w}")
