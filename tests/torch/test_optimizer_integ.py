"""DistributedOptimizer and broadcasts across real worker processes."""

import pytest
import torch

pytestmark = pytest.mark.integ

MODEL = """
import torch, torch.nn as nn
def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))
def batch(worker, step, passes=1):
    g = torch.Generator().manual_seed(1000 * step + worker)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(passes)]
"""

TRAIN = MODEL + """
import json, os, sys, gradpress.torch as bps
bps.init()
r = bps.rank()
passes = int(os.environ["GP_PASSES"])
model = make_model()
opt = getattr(torch.optim, os.environ["GP_OPT"])(model.parameters(), lr=0.05)
opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters(), backward_passes_per_step=passes,
                               compression=getattr(bps.Compression, os.environ["GP_COMPRESSION"]))
for step in range(6):
    opt.zero_grad()
    for x, y in batch(r, step, passes):
        (torch.nn.functional.cross_entropy(model(x), y) / passes).backward()
    opt.step()
torch.save(model.state_dict(), os.path.join(os.environ["GP_TEST_DIR"], f"params{r}.pt"))
bps.shutdown()
"""


@pytest.mark.parametrize("opt_name,passes,compression", [("SGD", 1, "none"), ("Adam", 1, "none"),
                                                          ("Adam", 2, "none"), ("SGD", 1, "fp16")])
def test_distributed_optimizer_equals_one_process_on_the_union_of_batches(cluster, opt_name, passes, compression):
    c = cluster(workers=2, servers=1)
    c.start(TRAIN, worker_env={"GP_OPT": opt_name, "GP_PASSES": str(passes),
                               "GP_COMPRESSION": compression}).assert_success()
    p0 = torch.load(c.tmp / "params0.pt")
    p1 = torch.load(c.tmp / "params1.pt")
    for k in p0:
        assert torch.equal(p0[k], p1[k]), f"{k} differs between the workers"
    # the same training in this process, on the union of both workers' batches
    ns = {}
    exec(MODEL, ns)
    model = ns["make_model"]()
    opt = getattr(torch.optim, opt_name)(model.parameters(), lr=0.05)
    for step in range(6):
        opt.zero_grad()
        for w in range(2):
            for x, y in ns["batch"](w, step, passes):
                # mean over workers of each worker's loss = the loss of the union of the batches
                (torch.nn.functional.cross_entropy(model(x), y) / passes / 2).backward()
        opt.step()
    # fp16 rounds each gradient once on the way out and once on the way back
    tol = dict(rtol=1e-5, atol=1e-6) if compression == "none" else dict(rtol=2e-3, atol=2e-4)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(p0[k], v, **tol, msg=lambda m: f"{k}: {m}")
    if compression == "fp16":  # and it really travelled as fp16: not bit-equal to the fp32 run
        assert any(not torch.equal(p0[k], v) for k, v in model.state_dict().items())


BROADCAST = """
import json, os, torch, torch.nn as nn, gradpress.torch as bps
bps.init()
r = bps.rank()
torch.manual_seed(r)  # every worker starts different
model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9))
if r == 1:  # the root has stepped (and carries state); the others have none
    model(torch.randn(5, 4)).sum().backward(); opt.step(); opt.step()
    model[1].num_batches_tracked.fill_(7)
    opt.param_groups[0]["lr"] = 0.123
bps.broadcast_parameters(model.state_dict(), root_rank=1)
bps.broadcast_optimizer_state(opt, root_rank=1)
other = nn.Linear(3, 3)  # named_parameters() (a generator) is accepted too
with torch.no_grad():
    other.weight.fill_(float(r + 10))
bps.broadcast_parameters(other.named_parameters(), root_rank=1, prefix="Other.")
assert torch.all(other.weight == 11), other.weight
sent = {"epoch": 3, "name": "run", "t": (1, 2.5), "a": torch.arange(3) if r == 1 else None}
obj = bps.broadcast_object(sent if r == 1 else None, root_rank=1)
sd = opt.state_dict()
torch.save({"model": model.state_dict(), "opt": sd, "obj": obj}, os.path.join(os.environ["GP_TEST_DIR"], f"b{r}.pt"))
# a parameter used on one worker only, from the first step: that worker's hooks push it
# first, the others at step(), in other orders than theirs; the averages come back the same
parts = nn.ModuleDict({"all": nn.Linear(3, 1), "one": nn.Linear(3, 1)})
bps.broadcast_parameters(parts.state_dict(), root_rank=0, prefix="Parts.")
dist = bps.DistributedOptimizer(torch.optim.SGD(parts.parameters(), lr=0.1), named_parameters=parts.named_parameters())
for step in range(2):
    dist.zero_grad()
    x = torch.ones(2, 3) * (r + 1)
    (parts["one"](x).sum() + parts["all"](x).sum() if r == 2 else parts["all"](x).sum()).backward()
    dist.step()
    assert torch.allclose(parts["one"].weight.grad, torch.full((1, 3), 2.0)), parts["one"].weight.grad
torch.save(parts.state_dict(), os.path.join(os.environ["GP_TEST_DIR"], f"parts{r}.pt"))
bps.shutdown()
"""


def test_broadcast_parameters_optimizer_state_and_object(cluster):
    c = cluster(workers=3, servers=2, env={"BYTEPS_LOG_LEVEL": "INFO"})
    c.start(BROADCAST).assert_success()
    for r in range(2):  # the launcher's server r is the job's (GRADPRESS_SERVER_ID), not the r-th to register
        assert f"server {r} serving on port" in c.log(f"server {r}"), c.log(f"server {r}")
        # a healthy job's first worker to end is no step mismatch (its INFO line said so)
        assert "different numbers of steps" not in c.log(f"server {r}"), c.log(f"server {r}")
    parts = [torch.load(c.tmp / f"parts{r}.pt") for r in range(3)]
    for k in parts[0]:
        assert torch.equal(parts[0][k], parts[1][k]) and torch.equal(parts[0][k], parts[2][k]), k
    got = [torch.load(c.tmp / f"b{r}.pt", weights_only=False) for r in range(3)]
    root = got[1]
    assert root["model"]["1.num_batches_tracked"].item() == 7
    assert root["opt"]["param_groups"][0]["lr"] == 0.123
    assert len(root["opt"]["state"]) == 6
    for r in (0, 2):
        for k, v in root["model"].items():
            assert torch.equal(got[r]["model"][k], v), f"worker {r}: model {k} differs from the root's"
        assert got[r]["opt"]["param_groups"] == root["opt"]["param_groups"], f"worker {r}: param groups differ"
        for pid, st in root["opt"]["state"].items():
            for k, v in st.items():
                assert torch.equal(got[r]["opt"]["state"][pid][k], v), f"worker {r}: optimizer state {pid}.{k} differs"
    for r in range(3):
        o = got[r]["obj"]
        assert o["epoch"] == 3 and o["name"] == "run" and o["t"] == (1, 2.5), (r, o)
        assert torch.equal(o["a"], torch.arange(3)), (r, o)
