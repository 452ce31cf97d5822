"""Adaptive optimizers with two-way compressed push/pull, two real workers, a small problem.

Adam, AdamW and AMSGrad wrapped by DistributedOptimizer on onebit + corrected error
feedback with a torch LR scheduler, and OneBitAdam: the parameters stay identical on
both workers, the loss falls close to uncompressed Adam's, and the learning rate that
corrected error feedback uses each step is the scheduler's, read from the group with no
call by the user.
"""
import json

import pytest

pytestmark = pytest.mark.integ
STEPS = 40
CASES = {
    "adam": {"opt": "Adam", "params": None},
    "adam_onebit": {"opt": "Adam", "params": {"compressor": "onebit", "scaling": "l2", "ef": "corrected"}},
    "adamw_onebit": {"opt": "AdamW", "params": {"compressor": "onebit", "scaling": "l2", "ef": "corrected"}},
    "amsgrad_onebit": {"opt": "Adam", "amsgrad": True,
                       "params": {"compressor": "onebit", "scaling": "l2", "ef": "corrected"}},
    "adam_topk": {"opt": "Adam", "params": {"compressor": "topk", "k": 0.1, "ef": "corrected"}},
    "onebit_adam": {"opt": "OneBitAdam"},
}

WORKER = """
import json, os, torch, gradpress.torch as bps
from gradpress.torch import ops
cases, steps = json.loads(os.environ["GP_CASES"]), int(os.environ["GP_STEPS"])
bps.init()
r = bps.rank()
client = ops._require()
torch.manual_seed(123)
teacher = torch.randn(16, 4) * 0.25
def data(seed, n):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    return x, torch.sin(x @ teacher)
x_eval, y_eval = data(999, 256)
schedule = lambda s: min(1.0, (s + 1) / 5) * (0.5 if s >= steps // 2 else 1.0)  # warm-up, then a step down
out = {}
for name, case in cases.items():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    named = [(f"{name}.{n}", p) for n, p in model.named_parameters()]
    if case["opt"] == "OneBitAdam":
        opt = bps.OneBitAdam(model.parameters(), lr=0.02, freeze_step=10, named_parameters=named)
    else:
        inner = getattr(torch.optim, case["opt"])(model.parameters(), lr=0.02, amsgrad=case.get("amsgrad", False))
        opt = bps.DistributedOptimizer(inner, named_parameters=named, compression_params=case["params"])
    with torch.no_grad():
        out["initial"] = torch.nn.functional.mse_loss(model(x_eval), y_eval).item()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    lrs, wire_lrs = [], []
    for step in range(steps):
        x, y = data(1000 * step + r, 32)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        t = client.tensor(f"Gradient.{name}.0.weight")
        if t is not None and t.compressor is not None:
            wire_lrs.append(list(t.compressor.state_dict()["lrs"].values()))
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(model(x_eval), y_eval).item()
    out[name] = {"loss": loss, "lrs": lrs, "wire_lrs": wire_lrs,
                 "params": [p.detach().flatten().tolist() for p in model.parameters()]}
with open(os.path.join(os.environ["GP_TEST_DIR"], f"w{r}.json"), "w") as fh:
    json.dump(out, fh)
bps.shutdown()
"""


def test_adaptive_optimizers_on_compressed_push_pull(cluster):
    c = cluster(workers=2, servers=1, env={"BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start(WORKER, worker_env={"GP_CASES": json.dumps(CASES), "GP_STEPS": str(STEPS)}).assert_success()
    got = [json.loads((c.tmp / f"w{r}.json").read_text()) for r in range(2)]
    initial = got[0]["initial"]
    baseline = got[0]["adam"]["loss"]
    assert baseline < 0.5 * initial, f"uncompressed Adam did not learn: loss {baseline}"
    for name in CASES:
        print(f"{name}: loss {got[0][name]['loss']:.4f} (uncompressed Adam {baseline:.4f}, initial {initial:.4f})")
        assert got[0][name]["params"] == got[1][name]["params"], f"{name}: the workers' parameters differ"
        loss = got[0][name]["loss"]
        assert loss < 1.5 * baseline, f"{name}: loss {loss:.4f}, uncompressed Adam {baseline:.4f}"
        if CASES[name].get("params"):
            # corrected EF saw, at every step, the lr the scheduler had set for that step
            lrs = got[0][name]["lrs"]
            assert len(set(lrs)) > 3, "the scheduler should change the lr"
            assert [w[0] for w in got[0][name]["wire_lrs"]] == lrs, f"{name}: lr on the wire != scheduler's"
