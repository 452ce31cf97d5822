"""DistributedOptimizer fuses the gradients one codec compresses (GRADPRESS_FUSE_COMPRESSED_BYTES):
one push_pull for several, under a key named by its members. Where the bucket's partitions
fall on its members' edges (each weight exactly one partition here), every partition holds
what it held apart, so onebit, topk and fp16 with error feedback train bit for bit as with
each gradient on its own; the small raw biases keep fusing among themselves."""
import pytest
import torch

WORKER = """
import os, torch, gradpress.torch as bps
from gradpress.torch import ops
bps.init()
CODECS = {"onebit": {"compressor": "onebit", "scaling": True, "ef": "vanilla"},
          "topk": {"compressor": "topk", "k": 0.05, "ef": "vanilla"},
          "fp16": {"compressor": "fp16", "ef": "corrected"}}
state = {}
for label, params in CODECS.items():
    torch.manual_seed(0)
    # each weight 32 x 32 float32: 4096 bytes, one partition (BYTEPS_PARTITION_BYTES=4096)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 32))
    named = [(f"{label}.{n}", p) for n, p in model.named_parameters()]
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=named, compression_params=params)
    g = torch.Generator().manual_seed(10 + bps.rank())
    for step in range(4):
        opt.zero_grad()
        model(torch.randn(16, 32, generator=g)).pow(2).mean().backward()
        opt.step()
    state.update({n: p.detach().clone() for n, p in named})
out = os.path.join(os.environ["GP_TEST_DIR"], f"w{bps.rank()}.pt")
torch.save({"state": state, "keys": sorted(ops.client().tensors)}, out)
bps.shutdown()
"""


@pytest.mark.integ
def test_compressed_gradients_fused_on_partition_edges_train_bit_for_bit_as_apart(cluster):
    runs = {}
    for fuse in ("65536", "0"):
        c = cluster(workers=2, servers=2, env={"GRADPRESS_FUSE_COMPRESSED_BYTES": fuse,
                                               "BYTEPS_PARTITION_BYTES": "4096", "BYTEPS_MIN_COMPRESS_BYTES": "1024"})
        c.start(WORKER).assert_success(120)
        runs[fuse] = [torch.load(c.tmp / f"w{r}.pt", weights_only=False) for r in range(2)]
    fused, apart = runs["65536"], runs["0"]
    keys = fused[0]["keys"]
    for label in ("onebit", "topk", "fp16"):
        weights = {f"Gradient.{label}.{i}.weight" for i in (0, 2, 4)}
        assert weights <= set(apart[0]["keys"]) and not weights & set(keys), keys
    assert sum(k.startswith("Gradient.fused.") for k in keys) == 3, keys  # one a codec
    assert sum(k.startswith("Gradient.small-fused.") for k in keys) == 3, keys  # the biases, as apart
    torch.manual_seed(0)
    start = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32))
    assert not torch.equal(apart[0]["state"]["onebit.2.weight"], start[2].weight), "training changed nothing"
    for r in range(2):
        for name, value in apart[r]["state"].items():
            assert torch.equal(fused[r]["state"][name], value), f"worker {r}: {name} differs when fused"
    assert all(torch.equal(fused[0]["state"][n], fused[1]["state"][n]) for n in fused[0]["state"])
