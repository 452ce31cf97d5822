"""Two models in one job whose parameter names are the same (a GAN's generator and
discriminator, ``nn.Sequential`` both: ``0.weight`` in each) and whose shapes differ.

Before, the second model's broadcast stopped with a TensorMismatchError on a key the user
never named (``Parameter.0.bias``: declared with 8 elements, now 5), and so did its
optimizer state's broadcast and its DistributedOptimizer's first step (``Gradient.0.weight``).
Now the broadcasts keep apart by themselves; the second optimizer is refused as it is built,
saying how to name its parameters apart (its keys are BytePS's, by name: one built again
over the same names takes the same keys, as a checkpoint's plan names them). Named apart,
both train as one process on the union of the workers' batches would."""

import pytest
import torch

pytestmark = pytest.mark.integ

MODELS = """
import torch, torch.nn as nn
def make_models():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 4)), nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 1))
def batch(worker, step):
    return torch.Generator().manual_seed(100 * step + worker)
def losses(G, D, g):
    z, real = torch.randn(6, 3, generator=g), torch.randn(6, 4, generator=g)
    fake = G(z)
    d_loss = (D(real) - 1).pow(2).mean() + D(fake.detach()).pow(2).mean()
    return d_loss, fake
"""

TRAIN = MODELS + """
import os, gradpress.torch as bps
bps.init()
r = bps.rank()
G, D = make_models()
if r == 1:  # the broadcasts must make them equal
    for p in list(G.parameters()) + list(D.parameters()):
        p.data.add_(1.0)
oG = bps.DistributedOptimizer(torch.optim.Adam(G.parameters(), lr=0.01), named_parameters=G.named_parameters())
try:
    bps.DistributedOptimizer(torch.optim.Adam(D.parameters(), lr=0.01), named_parameters=D.named_parameters())
    raise SystemExit("a second optimizer over names taken with other sizes was built")
except ValueError as e:
    assert "named_parameters=D.named_parameters(prefix='D')" in str(e) and "'0.bias'" in str(e), e
oD = bps.DistributedOptimizer(torch.optim.Adam(D.parameters(), lr=0.01),
                              named_parameters=D.named_parameters(prefix="D"))
bps.broadcast_parameters(G.state_dict(), root_rank=0)
bps.broadcast_parameters(D.state_dict(), root_rank=0)
bps.broadcast_optimizer_state(oG, root_rank=0)
bps.broadcast_optimizer_state(oD, root_rank=0)
for step in range(3):
    d_loss, fake = losses(G, D, batch(r, step))
    oD.zero_grad()
    d_loss.backward()
    oD.step()
    oG.zero_grad()
    (fake - 1).pow(2).mean().backward()  # (not through D: its hooks would send D's gradients too)
    oG.step()
torch.save({"G": G.state_dict(), "D": D.state_dict()}, os.path.join(os.environ["GP_TEST_DIR"], f"gan{r}.pt"))
bps.shutdown()
"""


def test_two_models_with_the_same_parameter_names_broadcast_apart_and_train_named_apart(cluster):
    c = cluster(workers=2, servers=1)
    c.start(TRAIN).assert_success()
    got = [torch.load(c.tmp / f"gan{r}.pt") for r in range(2)]
    ns = {}
    exec(MODELS, ns)
    G, D = ns["make_models"]()
    oG, oD = torch.optim.Adam(G.parameters(), lr=0.01), torch.optim.Adam(D.parameters(), lr=0.01)
    for step in range(3):  # one process on both workers' batches: the average of their losses
        out = [ns["losses"](G, D, ns["batch"](w, step)) for w in range(2)]
        oD.zero_grad()
        sum(d for d, _ in out).div(2).backward()
        oD.step()
        oG.zero_grad()
        sum((fake - 1).pow(2).mean() for _, fake in out).div(2).backward()
        oG.step()
    for model, want in (("G", G.state_dict()), ("D", D.state_dict())):
        for k, v in want.items():
            assert torch.equal(got[0][model][k], got[1][model][k]), f"{model}.{k} differs between the workers"
            torch.testing.assert_close(got[0][model][k], v, rtol=1e-5, atol=1e-6, msg=f"{model}.{k}")
