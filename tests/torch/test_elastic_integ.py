"""suspend() / resume(): leave a job, join the next one (here with fewer workers),
keeping the model and the optimizer: the trajectory is the one of an uninterrupted run."""
import subprocess
import time

import pytest
import torch

pytestmark = pytest.mark.integ

MODEL = """
import torch, torch.nn as nn
def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
def batch(worker, step):
    g = torch.Generator().manual_seed(1000 * step + worker)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
"""

ELASTIC = MODEL + """
import os, time, gradpress.torch as bps
d = os.environ["GP_TEST_DIR"]
bps.init()
r = bps.rank()
model = make_model()
compressed = os.environ.get("GP_COMPRESSED") == "1"
params = {"compressor": "onebit", "ef": "vanilla", "scaling": True} if compressed else None
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               named_parameters=model.named_parameters(), compression_params=params)
def train(steps):
    for step in steps:
        opt.zero_grad()
        x, y = batch(r, step)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
if os.environ.get("GP_UNINTERRUPTED") == "1":
    train(range(6))
    torch.save(model.state_dict(), os.path.join(d, f"params{r}.pt"))
    bps.shutdown()
    raise SystemExit(0)
train(range(3))
bps.suspend()
try:
    bps.rank()
    raise SystemExit("gradpress still answered after suspend()")
except Exception as e:
    assert "not initialised" in str(e), e
# as in BytePS, this process's place on its machine still answers (BytePS's elastic example logs with it)
assert (bps.local_rank(), bps.local_size()) == (int(os.environ.get("BYTEPS_LOCAL_RANK", 0)),
                                                int(os.environ.get("BYTEPS_LOCAL_SIZE", 1)))
leave = not compressed
if r == 1 and leave:
    raise SystemExit(0)            # worker 1 leaves; worker 0 goes on alone
open(os.path.join(d, f"suspended{r}"), "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(d, "port2")):
    assert time.monotonic() < deadline, "no second job"
    time.sleep(0.05)
os.environ["DMLC_PS_ROOT_PORT"] = open(os.path.join(d, "port2")).read()
if leave:
    bps.resume(1, 1, 0)
    assert (bps.rank(), bps.size()) == (0, 1)
else:
    bps.resume(2, 1, r)
    assert (bps.rank(), bps.size()) == (r, 2 * bps.local_size())
train(range(3, 6))
torch.save(model.state_dict(), os.path.join(d, f"params{r}.pt"))
bps.shutdown()
"""


def publish_port(d, port: int) -> None:
    """The resumed job's port, for the waiting workers: written whole, then renamed into place
    (a worker that saw the file before its text was in read "" and went to port 9000)."""
    (d / "port2.tmp").write_text(str(port))
    (d / "port2.tmp").rename(d / "port2")


def exit_code(first, name: str, second, timeout_s: float = 120) -> int:
    """The exit code of ``first``'s process ``name``, which went on in ``second``'s job; both
    jobs' logs where it is still running at the deadline (the whole suite shares 2 cores)."""
    try:
        return first.procs[name].wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{name} still running after {timeout_s} s\n{first.logs()}\n{second.logs()}") from None


def test_suspend_then_resume_with_fewer_workers_continues_the_same_trajectory(cluster):
    first = cluster(workers=2, servers=1)
    first.start(ELASTIC)
    deadline = time.monotonic() + 60
    while not (first.tmp / "suspended0").exists():
        assert time.monotonic() < deadline, first.logs()
        time.sleep(0.05)
    for name in ("scheduler", "server 0", "worker 1"):  # the first job ended cleanly
        assert first.procs[name].wait(timeout=30) == 0, first.logs()
    second = cluster(workers=1, servers=1, env={"GRADPRESS_JOB_SECRET": first.secret})  # the job it resumes into
    second.start_scheduler()
    second.start_server(0)
    publish_port(first.tmp, second.port)
    assert exit_code(first, "worker 0", second) == 0, first.logs() + second.logs()
    second.assert_success(timeout_s=30)

    ns = {}
    exec(MODEL, ns)
    model = ns["make_model"]()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(6):
        opt.zero_grad()
        workers = range(2) if step < 3 else range(1)
        for w in workers:
            x, y = ns["batch"](w, step)
            (torch.nn.functional.cross_entropy(model(x), y) / len(workers)).backward()
        opt.step()
    got = torch.load(first.tmp / "params0.pt")
    for k, v in model.state_dict().items():
        torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("local", [1, 2])
def test_a_compressed_run_suspended_and_resumed_is_bit_identical_to_an_uninterrupted_one(cluster, local):
    """The workers' and the servers' error-feedback residuals are carried into the next job;
    ``local`` 2: two machines of two workers reducing locally (each key's owner carries its
    machine's error feedback, and every owner restores the servers')."""
    env = {"BYTEPS_MIN_COMPRESS_BYTES": "0", "BYTEPS_PARTITION_BYTES": "64"}  # several keys per tensor

    def start(c, **worker_env):
        worker_env = {"GP_COMPRESSED": "1", **worker_env}
        return c.start(ELASTIC, worker_env=worker_env) if local == 1 else \
            c.start_machines(ELASTIC, local, worker_env=worker_env)
    workers = 2 * local
    reference = cluster(workers=2, servers=1, env=env)
    start(reference, GP_UNINTERRUPTED="1").assert_success()
    first = cluster(workers=2, servers=1, env=env)
    start(first)
    deadline = time.monotonic() + 60
    while not all((first.tmp / f"suspended{r}").exists() for r in range(workers)):
        assert time.monotonic() < deadline, first.logs()
        time.sleep(0.05)
    for name in ("scheduler", "server 0"):
        assert first.procs[name].wait(timeout=30) == 0, first.logs()
    second = cluster(workers=2, servers=1, env={**env, "GRADPRESS_JOB_SECRET": first.secret})
    second.start_scheduler()
    second.start_server(0)
    publish_port(first.tmp, second.port)
    for r in range(workers):
        assert exit_code(first, f"worker {r}", second) == 0, first.logs() + second.logs()
    second.assert_success(timeout_s=30)
    for r in range(workers):
        got, want = torch.load(first.tmp / f"params{r}.pt"), torch.load(reference.tmp / f"params{r}.pt")
        for k in want:
            assert torch.equal(got[k], want[k]), f"worker {r}, {k}: differs from the uninterrupted run"
