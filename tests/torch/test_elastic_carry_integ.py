"""What suspend() carries into the next job, in the cases the straight run does not cover:
a second scale event before any step, a state loaded (a checkpoint's) for a tensor not used
yet, a push_pull still under way at suspend(), and a new job with another number of workers."""
import time

import pytest
import torch

from test_elastic_integ import exit_code, publish_port

pytestmark = pytest.mark.integ

ENV = {"BYTEPS_MIN_COMPRESS_BYTES": "0"}
PARAMS = '{"compressor": "onebit", "ef": "vanilla", "scaling": True}'

# the first job: one compressed push_pull of x, then suspend(); join_second() waits for the next job's port
FIRST_JOB = f"""
import os, time, torch, gradpress.torch as bps
from gradpress.torch import elastic
def join_second(d):
    while not os.path.exists(os.path.join(d, "port2")): time.sleep(0.05)
    os.environ["DMLC_PS_ROOT_PORT"] = open(os.path.join(d, "port2")).read()
d = os.environ["GP_TEST_DIR"]
bps.init(); r = bps.rank()
t = torch.randn(64, generator=torch.Generator().manual_seed(r))
bps.push_pull(t, name="x", compression_params={PARAMS})
bps.suspend()
"""

TWICE = FIRST_JOB.replace("bps.suspend()", """
from gradpress.torch import ops
ops.client().load_compressor_state("y", ops.client().compressor_state("x"))  # a checkpoint's, y unused yet
bps.suspend()""") + """
first = elastic._carried["x"]
assert elastic._carried.get("y") is not None and elastic._carried["y"][0] is not None, "y's loaded state was lost"
open(os.path.join(d, f"suspended{r}"), "w").close()
join_second(d)
bps.resume(2, 1, r)
bps.suspend()                    # a second scale event, before any step of the job between
second = elastic._carried.get("x")
same = second is not None and all(
    a.tobytes() == b.tobytes() for a, b in zip(first[0]["residuals"].values(), second[0]["residuals"].values()))
servers = first[1] is None or (second[1] is not None and all(
    a[0].tobytes() == b[0].tobytes() for a, b in zip(first[1].values(), second[1].values())))
open(os.path.join(d, f"carried{r}"), "w").write(repr((second is not None, same, servers)))
"""


def _second_job(cluster, first, workers):
    deadline = time.monotonic() + 60
    while not all((first.tmp / f"suspended{r}").exists() for r in range(2)):
        assert time.monotonic() < deadline, first.logs()
        time.sleep(0.05)
    second = cluster(workers=workers, servers=1, env={**ENV, "GRADPRESS_JOB_SECRET": first.secret})
    second.start_scheduler()
    second.start_server(0)
    publish_port(first.tmp, second.port)
    return second


def test_a_second_suspend_before_any_step_carries_the_residuals_on(cluster):
    first = cluster(workers=2, servers=1, env=ENV)
    first.start(TWICE)
    second = _second_job(cluster, first, 2)
    for r in range(2):
        assert exit_code(first, f"worker {r}", second) == 0, first.logs() + second.logs()
    for r in range(2):
        found, same, servers = eval((first.tmp / f"carried{r}").read_text())
        assert found, f"worker {r}: the second suspend() carried nothing of 'x'"
        assert same and servers, f"worker {r}: the second suspend() carried other residuals (worker's {same}, " \
                                 f"servers' {servers})"


IN_FLIGHT = f"""
import os, time, torch, gradpress.torch as bps
from gradpress.torch import elastic
d = os.environ["GP_TEST_DIR"]
bps.init(); r = bps.rank()
for step in range(2):
    t = torch.randn(64, generator=torch.Generator().manual_seed(10 * step + r))
    if step == 1 and r == 1:
        time.sleep(2)            # rank 0 suspends while its round waits for this push
    h = bps.push_pull_async_inplace(t, name="x", compression_params={PARAMS})
    if step == 1 and r == 0:
        break                    # as CrossBarrier's step() returns: the push_pull still under way
    bps.synchronize(h)
bps.suspend()
outcome = "done"
if r == 0:
    try:
        bps.synchronize(h)
    except Exception as e:
        outcome = repr(e)
worker, servers = elastic._carried["x"]
torch.save({{"outcome": outcome, "worker": {{k: torch.from_numpy(v.copy()) for k, v in worker["residuals"].items()}},
            "servers": {{i: torch.from_numpy(v[0].copy()) for i, v in servers.items()}}}},
           os.path.join(d, f"carried{{r}}.pt"))
"""


def test_suspend_lets_a_push_pull_under_way_end_so_every_worker_carries_the_same_servers_state(cluster):
    c = cluster(workers=2, servers=1, env=ENV)
    c.start(IN_FLIGHT).assert_success()
    a, b = (torch.load(c.tmp / f"carried{r}.pt") for r in range(2))
    assert a["outcome"] == "done", a["outcome"]
    assert a["servers"].keys() == b["servers"].keys()
    for i in a["servers"]:
        assert torch.equal(a["servers"][i], b["servers"][i]), \
            f"partition {i}: the workers carry the servers' residual of different rounds"


FEWER = FIRST_JOB + """
carried = {i: v[0].copy() for i, v in elastic._carried["x"][1].items()}
open(os.path.join(d, f"suspended{r}"), "w").close()
if r == 1:
    raise SystemExit(0)          # worker 1 leaves
join_second(d)
bps.resume(1, 1, 0)
loaded = bps.ops.client().server_state("x")   # installed before x's first push in this job
torch.save({"carried": {i: torch.from_numpy(v) for i, v in carried.items()},
            "loaded": {i: torch.from_numpy(v[0].copy()) for i, v in loaded.items()}},
           os.path.join(d, "scaled.pt"))
bps.push_pull(t, name="x", compression_params={PARAMS})
bps.shutdown()
""".replace("{PARAMS}", PARAMS)


def test_the_servers_residuals_are_scaled_to_the_new_number_of_workers(cluster):
    """A servers' residual is a sum over the workers (each takes it divided by their
    number): from 2 workers to 1 it is halved, to add to the average what it lacked."""
    first = cluster(workers=2, servers=1, env=ENV)
    first.start(FEWER)
    second = _second_job(cluster, first, 1)
    assert exit_code(first, "worker 0", second) == 0, first.logs() + second.logs()
    second.assert_success(timeout_s=30)
    got = torch.load(first.tmp / "scaled.pt")
    assert got["carried"].keys() == got["loaded"].keys()
    for i, residual in got["carried"].items():
        assert residual.abs().max() > 0
        assert torch.equal(got["loaded"][i], residual * 0.5), f"partition {i}"
