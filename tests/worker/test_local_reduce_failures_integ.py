"""A local worker that dies or raises mid-step, with local reduction on (2 machines x 3
workers): every other process stops within the heartbeat deadline naming it, nothing
hangs on its shared segments, and no process keeps the job's shared memory mapped."""
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from cluster import job_leftovers

pytestmark = pytest.mark.integ
HEARTBEAT_TIMEOUT_S = 2.0
LOCAL = 3
VICTIM = 1  # local rank 1 of machine 0: an owner of some keys, and a peer of the owners of the others

# 12 partitions a step, so that every worker owns keys and hands others to their owners
TRAIN = """
import os, time, torch, gradpress.torch as bps
from gradpress.torch import ops
bps.init()
r = bps.rank()
assert ops.client().book.local_size == 3, ops.client().book
d = os.environ["GP_TEST_DIR"]
for step in range(100000):
    if step == 5:
        open(os.path.join(d, f"ready{r}"), "w").close()
    if r == 1 and os.path.exists(os.path.join(d, "fail")):
        with open(os.path.join(d, "failed_at"), "w") as fh:
            fh.write(repr(time.monotonic()))
        raise ValueError("boom in local worker 1")
    x = bps.push_pull(torch.ones(12000), average=False, name="w")
    assert bool((x == 6).all()), x[:4]
"""


def _wait_for_ready(c, workers: int, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not all((c.tmp / f"ready{r}").exists() for r in range(workers)):
        assert time.monotonic() < deadline, f"the workers never got going\n{c.logs()}"
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["kill", "raise"])
def test_a_local_worker_that_dies_or_raises_stops_every_process_naming_it(cluster, mode):
    c = cluster(workers=2, servers=1, env={"PS_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S),
                                           "GRADPRESS_OP_TIMEOUT_S": "120", "BYTEPS_PARTITION_BYTES": "4000"})
    c.start_machines(TRAIN, LOCAL, worker_env={"GP_MODE": mode})
    _wait_for_ready(c, 2 * LOCAL)
    pids = {p.pid for p in c.procs.values()}
    victim = f"worker {VICTIM}"
    started = time.monotonic()
    if mode == "kill":
        c.procs[victim].send_signal(signal.SIGKILL)
    else:
        (c.tmp / "fail").touch()
    limit_s = 2 * HEARTBEAT_TIMEOUT_S + 8  # detection, then six workers' exits on 2 shared cores
    for name, proc in c.procs.items():
        try:
            code = proc.wait(timeout=max(1.0, started + limit_s + 5 - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still running {time.monotonic() - started:.1f} s after {victim} "
                                 f"failed\n{c.logs()}")
        assert code != 0, f"{name} exited 0 after {victim} failed\n{c.logs()}"
        if name != victim:
            log = c.log(name)
            assert victim in log, f"{name}'s error does not name {victim}:\n{log}"
            if mode == "raise":
                assert "boom in local worker 1" in log, f"{name} does not say why {victim} failed:\n{log}"
    failed_at = float((c.tmp / "failed_at").read_text()) if mode == "raise" else started
    elapsed = time.monotonic() - failed_at
    assert elapsed <= limit_s, f"the job took {elapsed:.1f} s to stop\n{c.logs()}"
    assert not job_leftovers(pids), job_leftovers(pids)


# Worker 1 (local rank 1 of machine 0) runs one step fewer, then its script ends. Twelve
# partitions a step: it owns some keys and hands the others to worker 0, so its machine
# waits on it both ways (its push, its sum)
FEWER_STEPS = """
import time, torch, gradpress.torch as bps
bps.init()
x = torch.ones(12000)
for step in range(3 if bps.rank() == 1 else 4):
    started = time.monotonic()
    try:
        bps.push_pull_inplace(x, average=True, name="w")
    except Exception as e:  # the others' scripts go on a while (a checkpoint), holding the job
        print(f"failed after {time.monotonic() - started:.1f} s: {e}", flush=True)
        time.sleep(7)
        raise
print("all steps done", flush=True)
"""


def test_a_local_worker_that_runs_fewer_steps_stops_its_own_machine_at_once_too(cluster):
    # before: machine 1 failed at once (its server's round failed), but worker 0, waiting on
    # worker 1 as the owner of its keys and for its push to keys it owns, waited until the
    # op deadline or the job's end: the server tells only the machines that pushed
    c = cluster(workers=2, servers=1, env={"GRADPRESS_OP_TIMEOUT_S": "60", "BYTEPS_PARTITION_BYTES": "4000"})
    codes = c.start_machines(FEWER_STEPS, 2).wait(55)
    assert all(code != 0 for name, code in codes.items() if name != "worker 1"), f"exit codes {codes}\n{c.logs()}"
    for r in (0, 2, 3):
        log = c.log(f"worker {r}")
        failed = re.search(r"failed after ([\d.]+) s: (.*)", log)
        assert failed and "worker 1 finished" in failed.group(2), log
        assert float(failed.group(1)) < 5, log  # at once, not at the deadline or the others' end (7 s)


# Worker 1 stays alive (its heartbeats go on) but skips a step: worker 0's wait is a deadline
STALL = """
import os, time, numpy as np
from gradpress.config import Settings
from gradpress.worker import WorkerClient
from gradpress.errors import OpTimeoutError
c = WorkerClient(Settings.load(os.environ))
c.start()
r = c.rank
src, out = np.ones(2000, np.float32), np.empty(2000, np.float32)   # two partitions: one owned by each
c.push_pull_async("w", src, out, 1, 0).result(60)
if r == 1:
    time.sleep(30)
    os._exit(0)
try:
    c.push_pull_async("w", src, out, 1, 0).result(60)
except OpTimeoutError as e:
    print("TIMEOUT", e, flush=True)
    os._exit(0)
os._exit(2)
"""


def test_an_owner_waiting_for_a_live_peer_fails_at_its_deadline_naming_the_peer(cluster):
    c = cluster(workers=1, servers=1, env={"GRADPRESS_OP_TIMEOUT_S": "4", "BYTEPS_PARTITION_BYTES": "4000"})
    c.start_machines(STALL, 2)
    started = time.monotonic()
    code = c.procs["worker 0"].wait(timeout=60)
    assert code == 0 and "TIMEOUT" in c.log("worker 0"), c.logs()
    assert time.monotonic() - started < 40, c.logs()
    log = c.log("worker 0")
    # the key it owns waits for worker 1's push; the key worker 1 owns waits for worker 1's reply
    assert "waiting for the local push of worker(s) [1]" in log or "on local worker 1 (the key's owner)" in log, log
    c.kill()


# A NaN in one machine's sum under error feedback: its owner's codec cannot encode the round,
# and still pushes it, nonfinite, so every worker of both machines lands NaN for it at once
# (none waits out GRADPRESS_OP_TIMEOUT_S), and the next round is whole on all of them
NAN_ROUND = """
import os, time, numpy as np
from gradpress.compressors.spec import CodecSpec
from gradpress.config import Settings
from gradpress.errors import OpTimeoutError
from gradpress.worker import WorkerClient
c = WorkerClient(Settings.load(os.environ))
c.start()
r, n = c.rank, c.size
spec = CodecSpec.from_params({"compressor": "onebit", "ef": "vanilla", "scaling": True})
src = np.full(500, np.nan if r == 1 else 1.0, np.float32)
if r >= 2:  # machine 1 pushes late: machine 0's next round must wait for the skipped one to end
    time.sleep(3.0)
skipped = np.empty_like(src)
try:
    c.push_pull_async("g", src, skipped, n, 0, spec).result(30)
except OpTimeoutError as e:
    raise SystemExit(f"worker {r} waited out a skipped round: {e}")
assert np.isnan(skipped).all(), skipped[:4]
out = np.empty(500, np.float32)
c.push_pull_async("g", np.full(500, float(r + 1), np.float32), out, n, 0, spec).result(30)
assert np.all(out == out[0]) and out[0] > 0, out[:4]
np.save(os.path.join(os.environ["GP_TEST_DIR"], f"g{r}.npy"), out)
c.finish()
"""


def test_a_nan_in_one_machines_sum_skips_that_round_everywhere_at_once(cluster):
    c = cluster(workers=2, servers=1, env={"GRADPRESS_OP_TIMEOUT_S": "60", "BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start_machines(NAN_ROUND, 2)
    c.assert_success(50)  # well inside the 60 s a worker waiting out the round would take
    outs = [np.load(c.tmp / f"g{r}.npy") for r in range(4)]
    assert all(np.array_equal(o, outs[0]) for o in outs), "the round after the skipped one differs"


# As STALL, with a second machine that pushes the stalled round later: the owner that waits
# for worker 1 ends the server's round refused at its deadline, so machine 1's workers hear
# why then, instead of waiting out their own deadline for a round that cannot end
STALL_TWO_MACHINES = STALL.replace("""try:
    c.push_pull_async""", """if r >= 2:
    time.sleep(3.5)
try:
    c.push_pull_async""").replace("except OpTimeoutError as e:", "except (OpTimeoutError, JobError) as e:").replace(
    "from gradpress.errors import OpTimeoutError", "from gradpress.errors import JobError, OpTimeoutError").replace(
    'print("TIMEOUT", e, flush=True)',
    'print("FAILED", type(e).__name__, e, flush=True)\n    time.sleep(3)  # (its queued refusal goes out first)')


def test_an_owners_failed_round_ends_the_servers_round_for_the_other_machines(cluster):
    c = cluster(workers=2, servers=1, env={"GRADPRESS_OP_TIMEOUT_S": "4", "BYTEPS_PARTITION_BYTES": "4000"})
    c.start_machines(STALL_TWO_MACHINES, 2)
    for r in (0, 2, 3):
        assert c.procs[f"worker {r}"].wait(timeout=60) == 0, c.logs()
    for r in (2, 3):
        log = c.log(f"worker {r}")
        assert "FAILED JobError" in log and "refused by worker 0 (push_pull of tensor 'w': partition 0" in log, log
        assert "waiting for the local push of worker(s) [1]" in log, log
    c.kill()
