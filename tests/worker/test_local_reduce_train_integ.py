"""Training front ends with local reduction on (2 machines x 2 workers): DistributedOptimizer
(plain, and onebit with error feedback), DDP with several buckets, OneBitAdam, CrossBarrier and
a sparse embedding gradient. Every worker ends with the same parameters; the plain run equals
one process training on the union of the batches; row-sparse keys bypass the local owners."""
import pytest
import torch

pytestmark = pytest.mark.integ
MACHINES, LOCAL = 2, 2
WORKERS = MACHINES * LOCAL
STEPS = 4

MODEL = """
import torch, torch.nn as nn
def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 64), nn.Tanh(), nn.Linear(64, 3))
def batch(worker, step):
    g = torch.Generator().manual_seed(1000 * step + worker)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
"""

TRAIN = MODEL + """
import os, torch, gradpress.torch as bps
from gradpress.torch import cross_barrier as cb, ops
from gradpress.torch.parallel import DistributedDataParallel
bps.init()
r, d = bps.rank(), os.environ["GP_TEST_DIR"]
assert ops.client().book.local_size == 2 and bps.size() == 4 and bps.local_size() == 2
onebit = {"compressor": "onebit", "ef": "vanilla", "scaling": True}
runs = {}
def train(name, model, opt, sparse_input=None):
    for step in range(4):
        opt.zero_grad()
        x, y = batch(r, step)
        loss = nn.functional.cross_entropy(model(x), y)
        if sparse_input is not None:
            loss = loss + sparse_input(torch.tensor([r, 7, 3 * step])).sum()
        loss.backward()
        opt.step()
    if name == "cross_barrier":
        opt.synchronize()  # its last updates land when the next forward (or this) waits for them
    runs[name] = {k: v.clone() for k, v in model.state_dict().items()}
m = make_model()
train("plain", m, bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                           named_parameters=[("plain." + n, p) for n, p in m.named_parameters()]))
m = make_model()
train("onebit", m, bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), compression_params=onebit,
                                            named_parameters=[("onebit." + n, p) for n, p in m.named_parameters()]))
ddp = DistributedDataParallel(make_model(), bucket_cap_mb=0.0005)
train("ddp", ddp.module, torch.optim.SGD(ddp.parameters(), lr=0.1))
m = make_model()
train("onebit_adam", m, bps.OneBitAdam(m.parameters(), lr=0.01, freeze_step=2,
                                       named_parameters=[("adam." + n, p) for n, p in m.named_parameters()]))
m = make_model()
train("cross_barrier", m, cb.CrossBarrier(m, torch.optim.SGD(m.parameters(), lr=0.1), num_steps=4,
                                          named_parameters=[("cb." + n, p) for n, p in m.named_parameters()]))
torch.manual_seed(1)
emb = nn.Embedding(50, 4, sparse=True)
m = make_model()
class Both(nn.Module):
    def __init__(self):
        super().__init__()
        self.m, self.emb = m, emb
    def forward(self, x):
        return self.m(x)
both = Both()
opt = bps.DistributedOptimizer(torch.optim.SGD(both.parameters(), lr=0.1),
                               named_parameters=[("both." + n, p) for n, p in both.named_parameters()])
train("sparse", both, opt, sparse_input=emb)
# which keys went through the local owners: none of a row-sparse tensor's, every dense one's
keys = {n: [(wk.via is not None, wk.pushers) for wk in t.keys] for n, t in ops.client().tensors.items()}
torch.save({"runs": runs, "keys": keys}, os.path.join(d, f"w{r}.pt"))
bps.shutdown()
"""


def test_front_ends_keep_every_local_worker_identical(cluster):
    c = cluster(workers=MACHINES, servers=1, env={"BYTEPS_MIN_COMPRESS_BYTES": "0", "BYTEPS_PARTITION_BYTES": "512"})
    c.start_machines(TRAIN, LOCAL)
    c.assert_success(240)
    saved = [torch.load(c.tmp / f"w{r}.pt") for r in range(WORKERS)]
    for name, state in saved[0]["runs"].items():
        for r in range(1, WORKERS):
            for k, v in state.items():
                assert torch.equal(saved[r]["runs"][name][k], v), f"{name}: worker {r}'s {k} differs from worker 0's"
    keys = saved[0]["keys"]
    sparse = [n for n in keys if n.endswith("emb.weight") and n.startswith("Gradient.")]
    assert sparse, f"no row-sparse tensor was declared: {sorted(keys)}"
    for n in sparse:
        assert all(via is False and pushers == 0 for via, pushers in keys[n]), f"{n} went through a local owner"
    dense = [n for n in keys if n.startswith("Gradient.plain.")]
    for n in dense:  # each dense key: relayed to its owner on one worker, pushed for the machine on another
        routes = [saved[r]["keys"][n] for r in range(LOCAL)]
        for i in range(len(keys[n])):
            assert sorted(route[i][1] > 0 for route in routes) == [False, True], (n, i, routes)

    ns = {}
    exec(MODEL, ns)
    model = ns["make_model"]()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        for w in range(WORKERS):
            x, y = ns["batch"](w, step)
            (torch.nn.functional.cross_entropy(model(x), y) / WORKERS).backward()
        opt.step()
    for k, v in model.state_dict().items():
        torch.testing.assert_close(saved[0]["runs"]["plain"][k], v, rtol=1e-5, atol=1e-6)
