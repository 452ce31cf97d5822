"""DistributedDataParallel across real worker processes: the same parameters as
DistributedOptimizer after the same steps (with buckets, no_sync, compression), and
buffers broadcast from rank 0 at every forward."""
import pytest
import torch

pytestmark = pytest.mark.integ

DDP = """
import json, os, torch, torch.nn as nn, gradpress.torch as bps
from gradpress.torch.parallel import DistributedDataParallel
bps.init()
r = bps.rank()
variant = os.environ["GP_VARIANT"]
params = {"compressor": "onebit", "ef": "vanilla", "scaling": True} if variant == "onebit" else None
def make_model():
    torch.manual_seed(r)                      # different on each worker: the constructors broadcast rank 0's
    return nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))
def batch(step, i):
    g = torch.Generator().manual_seed(1000 * step + 10 * i + r)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
# A: DDP (several buckets; one per parameter when compressed, named as the optimizer names them)
a = DistributedDataParallel(make_model(), bucket_cap_mb=0 if params else 0.002, compression_params=params)
opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
# B: DistributedOptimizer under other names, accumulating the same two passes per step
b = make_model()
bps.broadcast_parameters([("b." + n, p) for n, p in b.state_dict().items()], root_rank=0)
opt_b = bps.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=0.1),
                                 named_parameters=[("b." + n, p) for n, p in b.named_parameters()],
                                 backward_passes_per_step=2, compression_params=params)
units = sum(len(r.members) if r.kind == "direct" else 1 for r in a._gradpress._routes())  # push_pulls a step
assert units > 1, "the test needs several buckets"
for step in range(4):
    opt_a.zero_grad()
    opt_b.zero_grad()
    x0, y0 = batch(step, 0)
    x1, y1 = batch(step, 1)
    with a.no_sync():
        (nn.functional.cross_entropy(a(x0), y0) / 2).backward()
    (nn.functional.cross_entropy(a(x1), y1) / 2).backward()   # averaged when backward returns
    opt_a.step()
    for x, y in ((x0, y0), (x1, y1)):
        (nn.functional.cross_entropy(b(x), y) / 2).backward()
    opt_b.step()
for (name, pa), pb in zip(a.module.named_parameters(), b.parameters()):
    assert torch.equal(pa, pb), f"{name}: DDP and DistributedOptimizer differ by {(pa - pb).abs().max()}"
torch.save(a.module.state_dict(), os.path.join(os.environ["GP_TEST_DIR"], f"ddp{r}.pt"))

# buffers: rank 0's at every forward
bn = DistributedDataParallel(nn.BatchNorm1d(4), bucket_cap_mb=0)
bn.eval()
bn.module.running_mean.fill_(float(r * 100 + 1))
bn(torch.randn(2, 4))
assert torch.all(bn.module.running_mean == 1.0), bn.module.running_mean
# parameters a forward did not use: the backward itself averages every gradient when it
# ends (BytePS needed a synchronize() after it, which now has nothing left to do); one used
# on worker 1 only is averaged with worker 0's zeros
for cap in (0, 25):  # a bucket each, and one bucket for all
    three = DistributedDataParallel(nn.ModuleDict({"used": nn.Linear(3, 1), "unused": nn.Linear(3, 1),
                                                   "rank1": nn.Linear(3, 1)}), bucket_cap_mb=cap)
    opt = torch.optim.SGD(three.parameters(), lr=0.1)
    for step in range(2):
        opt.zero_grad()
        x = torch.ones(2, 3) * (r + 1)
        loss = three.module["used"](x).sum() + (three.module["rank1"](x).sum() if r == 1 else 0)
        loss.backward()
        grads = {k: m.weight.grad for k, m in three.module.items()}
        assert torch.equal(grads["unused"], torch.zeros(1, 3)), grads
        assert torch.allclose(grads["used"], torch.full((1, 3), 3.0)), grads
        assert torch.allclose(grads["rank1"], torch.full((1, 3), 2.0)), grads
        three.synchronize()  # BytePS's advice: harmless, the averages stay
        assert torch.allclose(three.module["used"].weight.grad, torch.full((1, 3), 3.0))
        opt.step()
    torch.save(three.module.state_dict(), os.path.join(os.environ["GP_TEST_DIR"], f"three{cap}.{r}.pt"))
print("OK ddp", flush=True)
bps.shutdown()
"""


@pytest.mark.parametrize("variant", ["plain", "onebit"])
def test_ddp_equals_distributed_optimizer(cluster, variant):
    c = cluster(workers=2, servers=1, env={"BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start(DDP, worker_env={"GP_VARIANT": variant}).assert_success()
    assert "OK ddp" in c.log("worker 0") and "OK ddp" in c.log("worker 1"), c.logs()
    for saved in ("ddp", "three0.", "three25."):  # the models stayed the same on both workers
        p0, p1 = torch.load(c.tmp / f"{saved}0.pt"), torch.load(c.tmp / f"{saved}1.pt")
        for k in p0:
            assert torch.equal(p0[k], p1[k]), f"{saved}: {k} differs between the workers"


REWRAPPED = """
import warnings, torch, torch.nn as nn, gradpress.torch as bps
from gradpress.torch.parallel import DistributedDataParallel
bps.init()
r = bps.rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
model[0].weight.requires_grad_(False)
first = DistributedDataParallel(model)
first(torch.full((3, 4), float(r))).sum().backward()
model[0].weight.requires_grad_(True)   # what trains changes: torch's way is to wrap the module again
model.zero_grad()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    second = DistributedDataParallel(model)
    second(torch.full((3, 4), float(r + 1))).sum().backward()
assert not [w for w in caught if "became trainable" in str(w.message)], [str(w.message) for w in caught]
hooks = [len(p._post_accumulate_grad_hooks or {}) for p in model.parameters()]
assert hooks == [1, 1, 1, 1], f"the earlier wrapper's hooks are still there: {hooks}"
expected = torch.full((8, 4), 3 * 1.5) * model[1].weight.sum(0).unsqueeze(1)  # 3 rows of 1s and 2s, averaged
assert torch.allclose(model[0].weight.grad, expected), (model[0].weight.grad, expected)
print("OK rewrapped", flush=True)
bps.shutdown()
"""


def test_a_module_wrapped_again_leaves_the_earlier_wrapper(cluster):
    """The earlier wrapper's hooks went on pushing every gradient (and adopting the newly
    trainable ones, with a warning); now it stops, as torch's earlier reducer does."""
    c = cluster(workers=2, servers=1)
    c.start(REWRAPPED).assert_success()
    assert "OK rewrapped" in c.log("worker 0") and "OK rewrapped" in c.log("worker 1"), c.logs()


MOMENTUM_WARNING = """
import warnings, torch, gradpress.torch as bps
from gradpress.torch.parallel import DistributedDataParallel as DDP
bps.init()
for params, warned in (({"compressor": "onebit", "momentum": "nesterov"}, True), ({"compressor": "onebit"}, False)):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DDP(torch.nn.Linear(256, 256), compression_params=params)
    said = [str(w.message) for w in caught if "momentum is applied twice" in str(w.message)]
    assert bool(said) == warned, (params, [str(w.message) for w in caught])
bps.shutdown()
"""


def test_ddp_with_codec_momentum_says_the_optimizers_own_must_be_turned_off(cluster):
    """DistributedOptimizer folds the optimizer's momentum into the codecs'; DDP cannot, and the
    momentum was applied twice without a word."""
    c = cluster(workers=1, servers=1, env={"BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start(MOMENTUM_WARNING).assert_success()
