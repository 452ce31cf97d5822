"""CrossBarrier across real worker processes: its parameters are bit-identical to a
plain DistributedOptimizer's after the same steps, with SGD+momentum and with Adam. The
module answers BytePS's names (init, rank, broadcast_parameters, ...) as BytePS's does. A
GradScaler's step is refused, on every worker."""
import pytest

pytestmark = pytest.mark.integ

CROSS = """
import copy, os, torch, torch.nn as nn, gradpress.torch as bps
import gradpress.torch.cross_barrier as cb   # BytePS's example uses this module as its bps
cb.init()
r = cb.rank()
assert (cb.size(), cb.local_rank(), cb.local_size()) == (bps.size(), bps.local_rank(), bps.local_size())
opt_name = os.environ["GP_OPT"]
def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))
def make_opt(params):
    if opt_name == "SGD":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
    return torch.optim.Adam(params, lr=0.01)
def batch(step):
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
a, b = make_model(), make_model()
frozen = os.environ["GP_FREEZE"] == "1"  # the first layer trains from step 2 on
for m in (a, b):
    m[0].weight.requires_grad_(not frozen)
opt_a = cb.CrossBarrier(a, make_opt(a.parameters()), named_parameters=a.named_parameters(), num_steps=7)
cb.broadcast_parameters(a.state_dict(), root_rank=0)
cb.broadcast_optimizer_state(opt_a, root_rank=0)   # on workers but the root: load_state_dict
opt_b = bps.DistributedOptimizer(make_opt(b.parameters()),
                                 named_parameters=[("b." + n, p) for n, p in b.named_parameters()])
bps.broadcast_optimizer_state(opt_b, root_rank=0)
# the groups torch made in load_state_dict are where gradpress reads each parameter's lr
assert all(opt_b._groups[id(p)] is g for g in opt_b.param_groups for p in g["params"])
sched = torch.optim.lr_scheduler.StepLR(opt_b, step_size=2, gamma=0.5)
assert isinstance(opt_a, torch.optim.Optimizer)  # as BytePS's: an LR scheduler takes it
sched_a = torch.optim.lr_scheduler.StepLR(opt_a, step_size=2, gamma=0.5)
for step in range(6):
    x, y = batch(step)
    if frozen and step == 2:
        a[0].weight.requires_grad_(True)
        b[0].weight.requires_grad_(True)
    opt_a.zero_grad()
    nn.functional.cross_entropy(a(x), y).backward()   # a's forward waits for each layer's update
    opt_a.step()
    sched_a.step()  # the same schedule, changed right after step(), while the updater may still run
    opt_b.zero_grad()
    nn.functional.cross_entropy(b(x), y).backward()
    opt_b.step()
    sched.step()
    if step in (1, 3):  # a checkpoint's state, saved at step 1 and loaded into both at step 3
        opt_a.synchronize()
        if step == 1:
            saved = copy.deepcopy(opt_a.state_dict()), copy.deepcopy(opt_b.state_dict())
        else:
            opt_a.load_state_dict(saved[0])
            opt_b.load_state_dict(saved[1])
opt_a.synchronize()
for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
    assert torch.equal(pa, pb), f"{name}: CrossBarrier and DistributedOptimizer differ by {(pa - pb).abs().max()}"
# loss scaling: refused on every worker at the same step, naming what works instead
scaler = torch.amp.GradScaler("cpu")
scaler.scale(nn.functional.cross_entropy(a(x), y)).backward()
try:
    scaler.step(opt_a)
except ValueError as e:
    assert "GradScaler" in str(e) and "DistributedDataParallel" in str(e), e
else:
    raise AssertionError("CrossBarrier took a GradScaler's step")
opt_a.step()  # without the scaler: taken (the refusal left no scaler's attributes behind)
opt_a.synchronize()
print("OK cross barrier", flush=True)
cb.shutdown()
"""


@pytest.mark.parametrize("opt_name,freeze", [("SGD", "0"), ("Adam", "0"), ("SGD", "1")])
def test_cross_barrier_is_bit_identical_to_the_plain_optimizer(cluster, opt_name, freeze):
    """Also with a layer unfrozen after wrapping: both adopt it at the same step."""
    c = cluster(workers=2, servers=1)
    c.start(CROSS, worker_env={"GP_OPT": opt_name, "GP_FREEZE": freeze}).assert_success()
    assert "OK cross barrier" in c.log("worker 0") and "OK cross barrier" in c.log("worker 1"), c.logs()
