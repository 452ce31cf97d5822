"""OneBitAdam through real processes: a numpy replay of its steps, and checkpoints.

The replay does, for every step: warm-up, the average of both workers' gradients and an
Adam step; at the freeze, v bias-corrected and floored; after it, per partition, each
worker's momentum + error feedback + onebit (L2) compress (numpy reference codec), the
server's sum + error feedback + compress, the pulled average as the momentum, and the
update with the frozen variance. The system must match it to float32 rounding.
"""
import numpy as np
import pytest
import torch

from cluster import LocalCluster
from replay_codecs import TwoWayEF

pytestmark = pytest.mark.integ
LR, BETAS, EPS, WD, FREEZE, FLOOR, STEPS = 0.01, (0.9, 0.999), 1e-8, 0.01, 2, 0.1, 5
ENV = {"BYTEPS_PARTITION_BYTES": "2048", "BYTEPS_MIN_COMPRESS_BYTES": "0"}

COMMON = f"""
import os, torch, gradpress.torch as bps
from gradpress.torch import ops
bps.init()
r = bps.rank()
torch.manual_seed(0)
model = torch.nn.Linear(40, 30)
opt = bps.OneBitAdam(model.parameters(), lr={LR}, betas={BETAS}, eps={EPS}, weight_decay={WD},
                     freeze_step={FREEZE}, variance_floor={FLOOR}, named_parameters=model.named_parameters(),
                     compression_rules=[("bias", {{"compressor": "none"}})])
def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 40, generator=g), torch.randn(16, 30, generator=g)
def train(step):
    x, y = batch(step, r)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    grads = {{n: p.grad.clone() for n, p in model.named_parameters()}}
    opt.step()
    return grads
out = os.environ["GP_TEST_DIR"]
"""

REPLAY_WORKER = COMMON + """
log = {"init": {n: p.detach().clone() for n, p in model.named_parameters()}, "grads": [], "params": [], "frozen": []}
for step in range(int(os.environ["GP_STEPS"])):
    if step == 4:  # a checkpoint for the round-trip test, which resumes from it in a new job
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(out, f"ckpt{r}.pt"))
    log["grads"].append(train(step))
    log["params"].append({n: p.detach().clone() for n, p in model.named_parameters()})
    log["frozen"].append(opt.frozen)
t = ops._require().tensor("OneBitAdam.momentum.weight")
log["parts"] = t.parts
log["bias_compressed"] = ops._require().tensor("OneBitAdam.momentum.bias").compressor is not None
log["residuals"] = opt.state_dict()["onebit"]["worker_residuals"]
torch.save(log, os.path.join(out, f"w{r}.pt"))
bps.shutdown()
"""


def replay(init: dict, grads: list, parts: list, steps: int) -> tuple[list, dict]:
    """1-bit Adam of two workers in numpy; returns the parameters after every step and the
    worker residuals of the weight at the end (per worker, per partition)."""
    b1, b2 = np.float32(BETAS[0]), np.float32(BETAS[1])
    p = {n: v.numpy().ravel().astype(np.float32) for n, v in init.items()}
    m = {n: np.zeros_like(v) for n, v in p.items()}
    v = {n: np.zeros_like(x) for n, x in p.items()}
    ef, history = TwoWayEF({"compressor": "onebit", "scaling": "l2"}, parts), []
    for t in range(1, steps + 1):
        g = [{n: grads[r][t - 1][n].numpy().ravel() for n in p} for r in range(2)]
        for n in p:
            if t <= FREEZE:  # warm-up: Adam on the average of the gradients
                avg = (g[0][n] + g[1][n]) / np.float32(2)
                m[n] = m[n] * b1 + avg * (np.float32(1) - b1)
                v[n] = v[n] * b2 + avg * avg * (np.float32(1) - b2)
                if t == FREEZE:
                    v[n] = v[n] / np.float32(1 - BETAS[1] ** FREEZE)
                    floor = np.float32(FLOOR) * np.sqrt(v[n]).mean()
                    v[n] = np.maximum(v[n], floor * floor)
            else:
                local = [m[n] * b1 + g[r][n] * (np.float32(1) - b1) for r in range(2)]
                if n == "bias":  # exempt by rule: an uncompressed average
                    m[n] = (local[0] + local[1]) / np.float32(2)
                else:
                    m[n] = ef.average(n, local)
            if t >= FREEZE:
                denom = np.sqrt(v[n]) + np.float32(EPS)
            else:
                denom = np.sqrt(v[n] / np.float32(1 - BETAS[1] ** t)) + np.float32(EPS)
            update = m[n] / np.float32(1 - BETAS[0] ** t) / denom + np.float32(WD) * p[n]
            p[n] = p[n] - np.float32(LR) * update
        history.append({n: x.copy() for n, x in p.items()})
    return history, {(r, i): e for (_, r, i), e in ef.worker_e.items()}


@pytest.fixture(scope="module")
def first_job(tmp_path_factory):
    """Five steps of OneBitAdam (two of warm-up) with a checkpoint after four."""
    c = LocalCluster(tmp_path_factory.mktemp("onebit_adam"), workers=2, servers=1, env=ENV)
    try:
        c.start(REPLAY_WORKER, worker_env={"GP_STEPS": str(STEPS)}).assert_success()
        yield c
    finally:
        c.kill()


def test_onebit_adam_matches_numpy_replay(first_job):
    c = first_job
    got = [torch.load(c.tmp / f"w{r}.pt") for r in range(2)]
    assert got[0]["parts"] == [512, 512, 176], "the weight should span 3 partitions"
    assert not got[0]["bias_compressed"], "the rule should exempt the bias"
    assert got[0]["frozen"] == [False, True, True, True, True], "the variance freezes after freeze_step steps"
    for step in range(STEPS):
        for n, value in got[0]["params"][step].items():
            assert torch.equal(got[1]["params"][step][n], value), f"{n} differs between workers after step {step}"
    want, worker_e = replay(got[0]["init"], [g["grads"] for g in got], got[0]["parts"], STEPS)
    for step in range(STEPS):
        for n, value in want[step].items():
            np.testing.assert_allclose(got[0]["params"][step][n].numpy().ravel(), value, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{n} after step {step} "
                                               f"({'frozen' if step + 1 > FREEZE else 'warm-up'})")
    for r in range(2):  # the worker-side residuals the checkpoint reports are the replay's
        saved = got[r]["residuals"]["weight"]["residuals"]
        assert sorted(saved) == [0, 1, 2]
        for i in range(3):
            np.testing.assert_allclose(saved[i].numpy(), worker_e[(r, i)], rtol=1e-4, atol=1e-7,
                                       err_msg=f"worker {r} residual of partition {i}")


RESUME_WORKER = COMMON + """
saved = torch.load(os.path.join(out, f"ckpt{r}.pt"))
model.load_state_dict(saved["model"])
assert not opt.frozen
opt.load_state_dict(saved["opt"])
assert opt.frozen, "the frozen phase was not restored"
for i, p in enumerate(model.parameters()):
    for k in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(opt.state[p][k], saved["opt"]["state"][i][k]), f"{k} not restored"
train(4)
torch.save({"residuals": opt.state_dict()["onebit"]["worker_residuals"], "params": model.state_dict()},
           os.path.join(out, f"resumed{r}.pt"))
bps.shutdown()
"""


def test_onebit_adam_checkpoint_restores_phase_and_residuals(first_job, cluster):
    first = first_job
    second = cluster(workers=2, servers=1, env=ENV)
    for r in range(2):  # the new job resumes from the first job's checkpoints
        (second.tmp / f"ckpt{r}.pt").write_bytes((first.tmp / f"ckpt{r}.pt").read_bytes())
    second.start(RESUME_WORKER).assert_success()
    for r in range(2):
        ckpt = torch.load(first.tmp / f"ckpt{r}.pt")
        saved = ckpt["opt"]["onebit"]["worker_residuals"]["weight"]["residuals"]
        assert all(float(x.abs().sum()) > 0 for x in saved.values()), "the checkpoint holds no residuals"
        a = torch.load(first.tmp / f"w{r}.pt")  # the uninterrupted run, after its fifth step
        b = torch.load(second.tmp / f"resumed{r}.pt")
        # the step after the restore pushes exactly what the uninterrupted run pushed: the
        # worker's residual after it is the same bits
        for i, e in a["residuals"]["weight"]["residuals"].items():
            assert torch.equal(b["residuals"]["weight"]["residuals"][i], e), \
                f"worker {r}: residual of partition {i} after the resumed step differs"
        # the servers' residuals came back too: the resumed step is the uninterrupted one, bit for bit
        for n, v in a["params"][STEPS - 1].items():
            assert torch.equal(b["params"][n], v), f"worker {r}: {n} after the resumed step differs"
    b0, b1 = (torch.load(second.tmp / f"resumed{r}.pt")["params"] for r in range(2))
    assert all(torch.equal(b0[n], b1[n]) for n in b0), "workers differ after the restore"
