"""DistributedOptimizer fuses small 1-D gradients that travel uncompressed anyway (biases,
norms: GRADPRESS_FUSE_BELOW_BYTES): fewer keys, and the parameters after training are bit
for bit those of the same job with every tensor on its own."""
import pytest
import torch

WORKER = """
import os, sys, torch, gradpress.torch as bps
from gradpress.torch import ops
sys.path.insert(0, "examples")
from train_digits import DigitsCNN
bps.init()
torch.manual_seed(0)
model = DigitsCNN()
norm = torch.nn.LayerNorm(64)   # a norm's weight and bias, besides the layers' biases
params = list(model.named_parameters()) + [("norm." + n, p) for n, p in norm.named_parameters()]
opt = bps.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=0.1, momentum=0.9),
                               named_parameters=params, compression=bps.Compression.fp16)
# a second optimizer in the same process, float64, whose small tensors are fused too: its
# buckets must not take the first one's keys
head = torch.nn.Sequential(torch.nn.Linear(10, 6), torch.nn.LayerNorm(6)).double()
head_params = [("head." + n, p) for n, p in head.named_parameters()]
head_opt = bps.DistributedOptimizer(torch.optim.SGD(head.parameters(), lr=0.1), named_parameters=head_params)
g = torch.Generator().manual_seed(10 + bps.rank())
for step in range(3):
    opt.zero_grad()
    head_opt.zero_grad()
    x = torch.randn(16, 1, 8, 8, generator=g)
    (model(x).square().mean() + norm(torch.randn(4, 64, generator=g)).pow(3).mean()).backward()
    head(torch.randn(3, 10, generator=g, dtype=torch.float64)).pow(3).mean().backward()
    opt.step()
    head_opt.step()
params += head_params
torch.save({"state": {n: p.detach().clone() for n, p in params}, "keys": sorted(ops.client().tensors)},
           os.path.join(os.environ["GP_TEST_DIR"], f"w{bps.rank()}.pt"))
bps.shutdown()
"""


@pytest.mark.integ
def test_fused_small_gradients_train_bit_for_bit_as_apart(cluster, tmp_path):
    runs = {}
    for fuse in ("65536", "0"):
        c = cluster(workers=2, servers=1, env={"GRADPRESS_FUSE_BELOW_BYTES": fuse})
        c.start(WORKER).assert_success(120)
        runs[fuse] = [torch.load(c.tmp / f"w{r}.pt", weights_only=False) for r in range(2)]
    fused, apart = runs["65536"], runs["0"]
    biases = {"Gradient.fc1.bias", "Gradient.conv1.bias", "Gradient.norm.weight", "Gradient.norm.bias"}
    assert biases <= set(apart[0]["keys"]) and not biases & set(fused[0]["keys"]), fused[0]["keys"]
    assert sum(k.startswith("Gradient.small-fused.") for k in fused[0]["keys"]) == 2  # one per optimizer
    assert len(fused[0]["keys"]) < len(apart[0]["keys"])
    for r in range(2):
        for name, value in apart[r]["state"].items():
            assert torch.equal(fused[r]["state"][name], value), f"worker {r}: {name} differs with fusion"
    assert all(torch.equal(fused[0]["state"][n], fused[1]["state"][n]) for n in fused[0]["state"])
