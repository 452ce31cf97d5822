"""Mixed precision's loss scaling with DistributedOptimizer, in the pattern byteps-compat.md
shows (Horovod's): synchronize, unscale and clip, then step without a second
synchronize. An overflow on one worker (its gradient inf) reaches every worker's average,
so every GradScaler skips that step and lowers its scale alike, and steps on after it: the
models stay equal. Under a codec with error feedback (and worker momentum), the round
carrying the inf is skipped on every worker: NaN averages, and the key's state restarts."""
import pytest
import torch

pytestmark = pytest.mark.integ

AMP = """
import os, torch, gradpress.torch as bps
from gradpress.torch import ops
bps.init()
r = bps.rank()
codec = os.environ.get("GP_CODEC")
params = {"acpsgd": {"compressor": "acpsgd", "rank": 2}, "none": None,
          "onebit": {"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov", "scaling": True}}[codec]
torch.manual_seed(0)
model = torch.nn.Linear(64, 32)   # (a weight worth factoring at rank 2)
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               named_parameters=model.named_parameters(), compression_params=params)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
scales = []
for step in range(6):
    g = torch.Generator().manual_seed(100 * step + r)
    x = torch.randn(8, 64, generator=g)
    if step == 2 and r == 1:
        x[0, 0] = float("inf")   # this worker's gradient overflows
    opt.zero_grad()
    scaler.scale(model(x).pow(2).mean()).backward()
    opt.synchronize()
    if codec == "onebit":  # every worker's residual and momentum restarted at the skipped round only
        t = ops.client().tensors["Gradient.weight"]
        state = [(t.compressor._momenta.get(k.key), t.compressor.inner.residual(k.key)) for k in t.keys]
        assert all((m is None and e is None) == (step == 2) for m, e in state), (step, r)
        assert torch.isnan(model.weight.grad).all() == (step == 2), (step, r)
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with opt.skip_synchronize():
        scaler.step(opt)
    scaler.update()
    scales.append(scaler.get_scale())
    assert all(torch.isfinite(p).all() for p in model.parameters()), step
torch.save({"scales": scales, "params": model.state_dict()}, os.path.join(os.environ["GP_TEST_DIR"], f"amp{r}.pt"))
bps.shutdown()
"""


@pytest.mark.parametrize("codec", ["none", "acpsgd", "onebit"])
def test_loss_scaling_skips_an_overflow_step_on_every_worker_alike(cluster, codec):
    """acpsgd: the low-rank reducer skips the step alike too (its summed factor is not
    finite on every worker), and the steps after it are finite."""
    c = cluster(workers=2, servers=1, env={"BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start(AMP, worker_env={"GP_CODEC": codec}).assert_success()
    a, b = (torch.load(c.tmp / f"amp{r}.pt") for r in range(2))
    assert a["scales"] == b["scales"] and a["scales"][2] < a["scales"][1], a["scales"]
    assert a["scales"][3:] == [a["scales"][2]] * 3, f"the steps after the overflow were skipped too: {a['scales']}"
    for k in a["params"]:
        assert torch.equal(a["params"][k], b["params"][k]), k
