"""ZeroOneAdam through real processes: a numpy replay of its schedule and steps, parameters
identical after every synchronising step, checkpoints in each phase, and bad input.

The schedule of these tests (var_freeze_step 7, var_update_scaler 2, local_step_scaler 2,
local_step_clipper 4), read off DeepSpeed's zoadam.py: variance updates at steps 1, 2
(the interval doubles to 2), 4, 6 (to 4); momentum steps 3, 5, 7; after the freeze the
local interval is 1 for two steps (8, 9 sync), 2 for two (10 sync, 11 local), then 4
(12 sync, 13-15 local, 16 sync).
"""
import json

import numpy as np
import pytest
import torch

from cluster import LocalCluster
from gradpress.optim.zero_one_schedule import ZeroOneSchedule
from replay_codecs import TwoWayEF

LR, BETAS, EPS, WD, FLOOR, STEPS = 0.01, (0.9, 0.999), 1e-8, 0.01, 0.1, 16
SCHEDULE = {"var_freeze_step": 7, "var_update_scaler": 2, "local_step_scaler": 2, "local_step_clipper": 4}
KINDS = ["variance", "variance", "momentum", "variance", "momentum", "variance", "momentum",
         "sync", "sync", "sync", "local", "sync", "local", "local", "local", "sync"]
CHECKPOINTS = {3: "variance phase", 10: "local phase, at a sync", 11: "local phase, between syncs"}
ENV = {"BYTEPS_PARTITION_BYTES": "2048", "BYTEPS_MIN_COMPRESS_BYTES": "0"}
CODECS = {"onebit": {"compressor": "onebit", "scaling": "l2", "ef": "vanilla"},
          "topk": {"compressor": "topk", "k": 0.05, "ef": "vanilla"}}

COMMON = f"""
import json, os, torch, gradpress.torch as bps
bps.init()
r = bps.rank()
torch.manual_seed(0)
model = torch.nn.Linear(40, 30)
def make(**overrides):
    kw = dict(lr={LR}, betas={BETAS}, eps={EPS}, weight_decay={WD}, variance_floor={FLOOR},
              named_parameters=model.named_parameters(), compression_rules=[("bias", {{"compressor": "none"}})],
              compression_params=json.loads(os.environ["GP_CODEC"]), **{SCHEDULE!r})
    kw.update(overrides)
    return bps.ZeroOneAdam(model.parameters(), **kw)
opt = make()
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
errors = {}
for what, kw in {"freeze": {"var_freeze_step": 0}, "var_scaler": {"var_update_scaler": 0},
                 "local_scaler": {"local_step_scaler": 0}, "clipper": {"local_step_clipper": 0},
                 "topk_without_ef": {"compression_params": {"compressor": "topk", "k": 0.01}},
                 "scaled_randomk_with_ef": {"compression_params": {"compressor": "randomk", "k": 0.01,
                                                                    "scaling": True, "ef": "vanilla"}},
                 "unscaled_onebit": {"compression_params": {"compressor": "onebit", "ef": "vanilla"}},
                 "variance_codec": {"variance_compression_params": {"compressor": "topk", "k": 0.1, "ef": "vanilla"}},
                 "rule_with_worker_momentum": {"compression_rules": [("weight", {"compressor": "topk", "k": 0.01,
                                                                                 "ef": "vanilla",
                                                                                 "momentum": "nesterov"})]}}.items():
    try:
        make(**kw)
    except ValueError as e:
        errors[what] = str(e)
log = {"init": {n: p.detach().clone() for n, p in model.named_parameters()}, "grads": [], "params": [],
       "kinds": [], "in_sync": [], "errors": errors}
for step in range(int(os.environ["GP_STEPS"])):
    if step in (3, 10, 11):  # checkpoints for the resume tests, one per phase
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(out, f"ckpt{r}_{step}.pt"))
    log["grads"].append(train(step))
    log["params"].append({n: p.detach().clone() for n, p in model.named_parameters()})
    log["kinds"].append(opt.last_kind)
    log["in_sync"].append(opt.in_sync)
client = bps.ops.client()
log["parts"] = {t: client.tensor(t + "weight").parts for t in ("ZeroOneAdam.momentum.", "ZeroOneAdam.delta.")}
torch.save(log, os.path.join(out, f"w{r}.pt"))
bps.shutdown()
"""


def replay_kinds(steps: int, var_freeze_step: int, var_update_scaler: int, local_step_scaler: int,
                 local_step_clipper: int) -> list[str]:
    """The paper's sets, built directly: T_v (kappa updates at each interval, the interval
    doubling), then the sync steps after the freeze (multiples of an interval that doubles
    every local_step_scaler steps, up to the clipper)."""
    variance, interval, t = set(), 1, 0
    while t <= var_freeze_step:
        for _ in range(var_update_scaler):
            t = (t // interval + 1) * interval  # the next multiple of the interval
            if t <= var_freeze_step:
                variance.add(t)
        interval *= 2
    sync, interval, counted = set(), 1, 0
    for t in range(var_freeze_step + 1, steps + 1):
        if t % interval == 0:
            sync.add(t)
        counted += 1
        if counted == local_step_scaler:
            counted, interval = 0, min(local_step_clipper, 2 * interval)
    return [("variance" if t in variance else "momentum") if t <= var_freeze_step
            else ("sync" if t in sync else "local") for t in range(1, steps + 1)]


def replay(init: dict, grads: list, parts: list, codec: dict) -> list:
    """ZeroOneAdam of two workers in numpy: each worker's parameters after every step."""
    b1, b2, one = np.float32(BETAS[0]), np.float32(BETAS[1]), np.float32(1)
    names = list(init)
    p = [{n: v.numpy().ravel().astype(np.float32) for n, v in init.items()} for _ in range(2)]
    m = [{n: np.zeros_like(v) for n, v in p[0].items()} for _ in range(2)]
    v = {n: np.zeros_like(x) for n, x in p[0].items()}
    anchor, lrs = [{}, {}], [dict.fromkeys(names, 0.0) for _ in range(2)]
    ef = {n: TwoWayEF(codec, parts) for n in names}  # the bias is exempt: averaged uncompressed
    history, updates = [], 0
    for t, kind in enumerate(replay_kinds(STEPS, **SCHEDULE), 1):
        g = [{n: grads[r][t - 1][n].numpy().ravel() for n in names} for r in range(2)]
        updates += kind == "variance"
        bc1 = np.float32(1 - BETAS[0] ** t)

        def average(tensor: str, n: str, pushed: list) -> np.ndarray:
            return (pushed[0] + pushed[1]) / np.float32(2) if n == "bias" else ef[n].average(tensor, pushed)

        for n in names:
            if kind == "variance":
                avg = (g[0][n] + g[1][n]) / np.float32(2)
                mm = m[0][n] * b1 + avg * (one - b1)
                v[n] = v[n] * b2 + avg * avg * (one - b2)
                m[0][n], m[1][n] = mm, mm.copy()
            elif kind == "momentum":
                mm = average("momentum", n, [m[r][n] * b1 + g[r][n] * (one - b1) for r in range(2)])
                m[0][n], m[1][n] = mm, mm.copy()
            root = np.sqrt(v[n] / np.float32(1 - BETAS[1] ** updates))
            denom = np.maximum(root, np.float32(FLOOR) * root.mean()) + np.float32(EPS)
            for r in range(2):
                if kind in ("sync", "local"):
                    if n not in anchor[r]:
                        anchor[r][n] = p[r][n].copy()
                    m[r][n] = m[r][n] * b1 + g[r][n] * (one - b1)
                    lrs[r][n] += LR
                p[r][n] = p[r][n] - np.float32(LR) * (m[r][n] / bc1 / denom + np.float32(WD) * p[r][n])
            if kind == "sync":
                avg = average("delta", n, [(p[r][n] - anchor[r][n]) * denom for r in range(2)])
                for r in range(2):
                    p[r][n] = anchor[r][n] + avg / denom
                    m[r][n] = avg / np.float32(-lrs[r][n]) * bc1
                    anchor[r][n], lrs[r][n] = p[r][n].copy(), 0.0
        history.append([{n: x.copy() for n, x in p[r].items()} for r in range(2)])
    return history


def test_schedule_follows_deepspeed():
    """DeepSpeed's defaults (kappa 16): variance steps 1..16, then every 2nd step to 48, then every 4th."""
    s = ZeroOneSchedule(var_freeze_step=60, var_update_scaler=16, local_step_scaler=32678, local_step_clipper=16)
    kinds = [s.advance() for _ in range(64)]
    variance = [t for t, k in enumerate(kinds, 1) if k == "variance"]
    assert variance == list(range(1, 17)) + list(range(18, 49, 2)) + [52, 56, 60]
    assert kinds[60:] == ["sync"] * 4, "after the freeze the local interval starts at 1"
    assert replay_kinds(STEPS, **SCHEDULE) == KINDS
    s = ZeroOneSchedule(**SCHEDULE)
    assert [s.advance() for _ in range(STEPS)] == KINDS
    assert (s.var_updates, s.local_interval) == (4, 4)


@pytest.mark.parametrize("bad, message", [
    ({"var_freeze_step": 0}, "var_freeze_step=0"), ({"var_update_scaler": 0}, "var_update_scaler=0"),
    ({"local_step_scaler": 0}, "local_step_scaler=0"), ({"local_step_clipper": 0.5}, "local_step_clipper=0.5")])
def test_schedule_rejects_bad_input(bad, message):
    with pytest.raises(ValueError, match=message):
        ZeroOneSchedule(**{**SCHEDULE, **bad})


@pytest.fixture(scope="module", params=sorted(CODECS))
def first_job(request, tmp_path_factory):
    """Sixteen steps of ZeroOneAdam (every kind of step) with checkpoints after 3, 10 and 11."""
    c = LocalCluster(tmp_path_factory.mktemp("zero_one_adam"), workers=2, servers=1, env=ENV)
    try:
        c.start(REPLAY_WORKER, worker_env={"GP_STEPS": str(STEPS),
                                           "GP_CODEC": json.dumps(CODECS[request.param])}).assert_success()
        c.codec = request.param
        yield c
    finally:
        c.kill()


@pytest.mark.integ
def test_zero_one_adam_matches_numpy_replay(first_job):
    got = [torch.load(first_job.tmp / f"w{r}.pt") for r in range(2)]
    assert got[0]["kinds"] == KINDS, "the system's schedule is not the replay's"
    parts = got[0]["parts"]["ZeroOneAdam.momentum."]
    assert parts == [512, 512, 176] == got[0]["parts"]["ZeroOneAdam.delta."]
    differ = []
    for step, kind in enumerate(KINDS):
        same = all(torch.equal(got[0]["params"][step][n], x) for n, x in got[1]["params"][step].items())
        assert got[0]["in_sync"][step] == (kind != "local")
        if kind == "local":
            differ.append(not same)
        else:
            assert same, f"workers' parameters differ after step {step + 1} ({kind})"
    assert all(differ), "local steps should use each worker's own gradient"
    want = replay(got[0]["init"], [g["grads"] for g in got], parts, CODECS[first_job.codec])
    # a step moves a parameter by about lr = 1e-2; float32 rounding (torch's and numpy's sums
    # differ in order) stays below 1e-5 over these 16 steps
    for step, kind in enumerate(KINDS):
        for r in range(2):
            for n, value in want[step][r].items():
                np.testing.assert_allclose(got[r]["params"][step][n].numpy().ravel(), value, rtol=1e-5, atol=1e-5,
                                           err_msg=f"worker {r}: {n} after step {step + 1} ({kind})")


@pytest.mark.integ
def test_bad_input_is_refused_before_the_first_step(first_job):
    errors = torch.load(first_job.tmp / "w0.pt")["errors"]
    expected = {"freeze": "var_freeze_step=0", "var_scaler": "var_update_scaler=0",
                "local_scaler": "local_step_scaler=0", "clipper": "local_step_clipper=0",
                "topk_without_ef": "needs error feedback", "scaled_randomk_with_ef": "not contractive",
                "unscaled_onebit": "needs 'scaling'", "rule_with_worker_momentum": "rule 'weight'",
                "variance_codec": "full precision"}
    for what, fragment in expected.items():
        assert what in errors, f"{what}: no ValueError"
        assert fragment in errors[what], f"{what}: {errors[what]!r} does not say {fragment!r}"


RESUME_WORKER = COMMON + """
k = int(os.environ["GP_FROM"])
saved = torch.load(os.path.join(out, f"ckpt{r}_{k}.pt"))
model.load_state_dict(saved["model"])
opt.load_state_dict(saved["opt"])
assert opt.schedule.step == k, f"schedule restored at step {opt.schedule.step}, not {k}"
params = []
for step in range(k, int(os.environ["GP_STEPS"])):
    train(step)
    params.append({n: p.detach().clone() for n, p in model.named_parameters()})
torch.save(params, os.path.join(out, f"resumed{r}.pt"))
bps.shutdown()
"""


@pytest.mark.integ
@pytest.mark.parametrize("first_job", ["onebit"], indirect=True)  # the default codec's job
@pytest.mark.parametrize("k", sorted(CHECKPOINTS))
def test_checkpoint_in_each_phase_resumes_bit_for_bit(first_job, cluster, k):
    second = cluster(workers=2, servers=1, env=ENV)
    for r in range(2):  # the new job resumes from the first job's checkpoints
        name = f"ckpt{r}_{k}.pt"
        (second.tmp / name).write_bytes((first_job.tmp / name).read_bytes())
    second.start(RESUME_WORKER, worker_env={"GP_STEPS": str(STEPS), "GP_FROM": str(k),
                                            "GP_CODEC": json.dumps(CODECS["onebit"])}).assert_success()
    for r in range(2):
        ckpt = torch.load(first_job.tmp / f"ckpt{r}_{k}.pt")["opt"]["zero_one"]["momentum"]
        assert ckpt["worker_residuals"] and ckpt["server_residuals"], "the checkpoint holds no residuals"
        a = torch.load(first_job.tmp / f"w{r}.pt")["params"]
        b = torch.load(second.tmp / f"resumed{r}.pt")
        for i, step in enumerate(range(k, STEPS)):
            for n, value in a[step].items():
                assert torch.equal(b[i][n], value), \
                    f"worker {r}, resumed from {CHECKPOINTS[k]} (step {k}): {n} differs after step {step + 1}"
