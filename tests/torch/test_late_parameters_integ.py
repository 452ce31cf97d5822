"""Parameters that become trainable after the optimizer is wrapped (a frozen layer unfrozen, a
param group added), and the wrapped optimizer's own constructor arguments and state."""
import pytest
import torch

pytestmark = pytest.mark.integ

MODEL = """
import torch
def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
def batch(worker, step):
    g = torch.Generator().manual_seed(100 * step + worker)
    return torch.randn(6, 5, generator=g)
def loss_of(model, x):
    return (model(x) ** 2).mean()
UNFREEZE_AT = 2
STEPS = 5
def train_unfreezing(model, forward, opt, worker):
    # STEPS steps on the worker's batches, model[0].weight trainable from UNFREEZE_AT on;
    # returns the warnings raised
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(STEPS):
            if step == UNFREEZE_AT:
                model[0].weight.requires_grad_(True)
            opt.zero_grad()
            loss_of(forward, batch(worker, step)).backward()
            opt.step()
    return [str(w.message) for w in caught]
"""

WORKER = MODEL + """
import os, gradpress.torch as bps
bps.init()
r, out = bps.rank(), {}

model = make_model()
model[0].weight.requires_grad_(False)
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               named_parameters=model.named_parameters())
out["warnings"] = train_unfreezing(model, model, opt, r)
out["unfrozen"] = {k: v.clone() for k, v in model.state_dict().items()}

from gradpress.torch.parallel import DistributedDataParallel
inner = make_model()
inner[0].weight.requires_grad_(False)
ddp = DistributedDataParallel(inner)
out["warnings"] += train_unfreezing(inner, ddp, torch.optim.SGD(inner.parameters(), lr=0.1, momentum=0.9), r)
out["ddp"] = {k: v.clone() for k, v in inner.state_dict().items()}

a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
opt = bps.DistributedOptimizer(torch.optim.SGD([a], lr=0.25), named_parameters=[("a", a)])
opt.add_param_group({"params": [b]})
for step in range(2):
    opt.zero_grad()
    (a.sum() * (r + 1) + (b * b).sum() * (r + 1)).backward()
    opt.step()
out["added"] = (a.detach().clone(), b.detach().clone(), opt.param_groups[1]["lr"])

class NeedsLr(torch.optim.Optimizer):
    def __init__(self, params, lr):
        super().__init__(params, dict(lr=lr))
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.data.add_(p.grad, alpha=-group["lr"])
c = torch.nn.Parameter(torch.ones(2))
opt = bps.DistributedOptimizer(NeedsLr([c], lr=0.5), named_parameters=[("c", c)])
(c.sum() * (r + 1)).backward()
opt.step()
out["custom"] = c.detach().clone()
try:
    bps.DistributedOptimizer(opt, named_parameters=[("c", c)])
    out["double"] = "wrapped twice"
except ValueError as e:
    out["double"] = str(e)

d = torch.nn.Parameter(torch.ones(2))
base = torch.optim.SGD([d], lr=0.1, momentum=0.5)
base.load_state_dict({"state": {0: {"momentum_buffer": torch.full((2,), 4.0)}},
                      "param_groups": [dict(base.param_groups[0], params=[0])]})
opt = bps.DistributedOptimizer(base, named_parameters=[("d", d)])
(d.sum() * (r + 1)).backward()
opt.step()
out["loaded"] = d.detach().clone()

m = make_model()
m[0].weight.requires_grad_(False)
adam = bps.OneBitAdam(m.parameters(), lr=0.01, freeze_step=2, named_parameters=m.named_parameters())
m[0].weight.requires_grad_(True)
loss_of(m, batch(r, 0)).backward()
try:
    adam.step()
    out["onebit"] = "stepped"
except ValueError as e:
    out["onebit"] = str(e)
torch.save(out, os.path.join(os.environ["GP_TEST_DIR"], f"out{r}.pt"))
bps.shutdown()
"""


def _reference_unfreeze() -> dict:
    """One process on both workers' batches: the average of their gradients, SGD with momentum."""
    scope: dict = {}
    exec(MODEL, scope)
    model = scope["make_model"]()
    model[0].weight.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(scope["STEPS"]):
        if step == scope["UNFREEZE_AT"]:
            model[0].weight.requires_grad_(True)
        opt.zero_grad()
        loss = sum(scope["loss_of"](model, scope["batch"](w, step)) for w in range(2)) / 2
        loss.backward()
        opt.step()
    return model.state_dict()


def test_late_parameters_are_averaged_and_the_wrapped_optimizer_keeps_its_arguments(cluster):
    c = cluster(workers=2, servers=1)
    c.start(WORKER).assert_success()
    outs = [torch.load(c.tmp / f"out{r}.pt", weights_only=False) for r in range(2)]
    reference = _reference_unfreeze()
    for r, out in enumerate(outs):
        # the unfrozen layer moved, and as one process on the union of the batches moves it
        assert not torch.equal(out["unfrozen"]["0.weight"], scope_initial_weight()), r
        for k, v in reference.items():
            torch.testing.assert_close(out["unfrozen"][k], v, rtol=1e-5, atol=1e-6, msg=f"worker {r}: {k}")
        assert any("0.weight became trainable" in w for w in out["warnings"]), out["warnings"]
        for k, v in reference.items():  # DDP: averaged at the end of the backward that unfroze it
            torch.testing.assert_close(out["ddp"][k], v, rtol=1e-5, atol=1e-6, msg=f"worker {r}: DDP {k}")
        assert any("DistributedDataParallel: 0.weight became trainable" in w for w in out["warnings"])
        # the added group takes the wrapped optimizer's lr (0.25), and its gradient is averaged:
        # a's gradient averages to 1.5, b's to 1.5 * 2b
        a, b, lr = out["added"]
        assert lr == 0.25
        torch.testing.assert_close(a, torch.full((3,), 1 - 2 * 0.25 * 1.5))
        b_expected = torch.ones(2)
        for _ in range(2):
            b_expected = b_expected - 0.25 * 1.5 * 2 * b_expected
        torch.testing.assert_close(b, b_expected)
        torch.testing.assert_close(out["custom"], torch.full((2,), 1 - 0.5 * 1.5))
        assert "a DistributedOptimizer already" in out["double"], out["double"]
        # the momentum buffer loaded before wrapping: buf = 0.5 * 4 + 1.5
        torch.testing.assert_close(out["loaded"], torch.full((2,), 1 - 0.1 * (0.5 * 4 + 1.5)))
        assert "OneBitAdam: ['0.weight'] became trainable after the optimizer was built" in out["onebit"], out


def scope_initial_weight() -> torch.Tensor:
    scope: dict = {}
    exec(MODEL, scope)
    return scope["make_model"]()[0].weight.detach()


FROZEN = MODEL + """
import os, gradpress.torch as bps
from gradpress.torch.parallel import DistributedDataParallel
bps.init()
r, out = bps.rank(), {}
for way in ("optimizer", "ddp", "cross_barrier", "onebit", "zero_one"):
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    forward = model
    if way == "onebit":   # frozen at its compressed steps' start
        opt = bps.OneBitAdam(model.parameters(), lr=0.01, weight_decay=0.01, freeze_step=UNFREEZE_AT,
                             named_parameters=model.named_parameters())
    elif way == "zero_one":
        opt = bps.ZeroOneAdam(model.parameters(), lr=0.01, weight_decay=0.01, var_freeze_step=UNFREEZE_AT,
                              local_step_scaler=1, named_parameters=model.named_parameters())
    elif way == "optimizer":
        opt = bps.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    elif way == "cross_barrier":
        from gradpress.torch.cross_barrier import CrossBarrier
        opt = CrossBarrier(model, sgd, named_parameters=model.named_parameters())
    else:
        forward, opt = DistributedDataParallel(model), sgd
    for step in range(STEPS):
        if step == UNFREEZE_AT:   # frozen after wrapping: torch's optimizers leave it where it is
            model[0].requires_grad_(False)
            frozen_at = {k: v.clone() for k, v in model[0].state_dict().items()}
        opt.zero_grad(set_to_none=True)
        loss_of(forward, batch(r, step)).backward()
        opt.step()
    if way == "cross_barrier":
        opt.synchronize()
    out[way] = (frozen_at, {k: v.clone() for k, v in model[0].state_dict().items()}, model[0].weight.grad)
torch.save(out, os.path.join(os.environ["GP_TEST_DIR"], f"frozen{r}.pt"))
bps.shutdown()
"""


def test_a_layer_frozen_after_wrapping_is_left_where_it_is(cluster):
    """As in torch: with momentum and weight decay, zeros pushed for a frozen layer and made
    its gradient would move it on; its gradient stays None. OneBitAdam and ZeroOneAdam leave
    it out of their update too."""
    c = cluster(workers=2, servers=1)
    c.start(FROZEN).assert_success()
    for r in range(2):
        got = torch.load(c.tmp / f"frozen{r}.pt")
        for way, (before, after, grad) in got.items():
            assert grad is None, f"worker {r}, {way}: the frozen layer has a gradient"
            for k in before:
                assert torch.equal(before[k], after[k]), f"worker {r}, {way}: the frozen layer's {k} moved"
