"""With ``momentum: "nesterov"`` in compression_params, the gradients of a folded param group
that travel uncompressed (under BYTEPS_MIN_COMPRESS_BYTES, or exempted by a rule) keep the
group's momentum, as torch's SGD with Nesterov momentum applies it to their average: a
reference in this process, on the same averages, steps bit for bit alike, through a step a
loss scaler skips and a checkpoint restored into a new optimizer. (Before, the group's
momentum was set to 0 for all its gradients, and these trained with none.)"""
import pytest
import torch

pytestmark = pytest.mark.integ

GRADS = """
import torch
def grads(worker, step):
    g = torch.Generator().manual_seed(100 * step + worker)
    return torch.randn(20000, generator=g), torch.randn(10, generator=g), torch.randn(20000, generator=g)
"""

TRAIN = GRADS + """
import os, gradpress.torch as bps
bps.init()
r = bps.rank()

def build():
    w, b, e = (torch.nn.Parameter(torch.zeros(n)) for n in (20000, 10, 20000))
    opt = bps.DistributedOptimizer(
        torch.optim.SGD([w, b, e], lr=0.1, momentum=0.5, nesterov=True),
        named_parameters=[("w", w), ("b", b), ("e", e)],
        compression_params={"compressor": "onebit", "scaling": True, "ef": "vanilla", "momentum": "nesterov"},
        compression_rules=[("e", {"compressor": "none"})])
    assert opt.param_groups[0]["momentum"] == 0, "w's codec carries the group's momentum"
    return (w, b, e), opt

params, opt = build()
for step in range(6):
    if step == 4:  # a checkpoint, restored into a new optimizer (as a restarted job does)
        state = opt.state_dict()
        saved = [p.detach().clone() for p in params]
        params, opt = build()
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
        opt.load_state_dict(state)
    opt.zero_grad()
    loss = sum((p * g).sum() for p, g in zip(params, grads(r, step)))
    loss.backward()
    opt.synchronize()
    if step == 2:
        continue  # skipped, as a GradScaler skips a step whose gradients overflowed
    with opt.skip_synchronize():
        opt.step()
torch.save([p.detach() for p in params[1:]], os.path.join(os.environ["GP_TEST_DIR"], f"w{r}.pt"))
bps.shutdown()
"""


def test_uncompressed_gradients_of_a_folded_group_keep_its_nesterov_momentum(cluster):
    c = cluster(workers=2, servers=1)
    c.start(TRAIN).assert_success()
    ns = {}
    exec(GRADS, ns)
    b, e = (torch.nn.Parameter(torch.zeros(n)) for n in (10, 20000))
    reference = torch.optim.SGD([b, e], lr=0.1, momentum=0.5, nesterov=True)
    for step in range(6):
        g0, g1 = ns["grads"](0, step), ns["grads"](1, step)
        b.grad, e.grad = (g0[1] + g1[1]) / 2, (g0[2] + g1[2]) / 2  # the servers' float32 sum, averaged
        if step != 2:
            reference.step()
    for r in range(2):
        got = torch.load(c.tmp / f"w{r}.pt")
        assert torch.equal(got[0], b.detach()), f"worker {r}: the small gradient's momentum is not torch's"
        assert torch.equal(got[1], e.detach()), f"worker {r}: the exempted gradient's momentum is not torch's"
