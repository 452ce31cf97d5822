"""BytePS API behaviour that its example scripts and common training code rely on, across
real worker processes: integer (and bool) averages floor-divided, declare's 0, unnamed broadcasts of
other shapes, tied weights broadcast once, numpy scalars in an optimizer's hyper-parameters,
frozen parameters left out of named_parameters, set_backward_passes_per_step, an
optimizer's own zero_grad signature, BytePS's Compressor base class,
two DistributedDataParallel models whose parameter names are the same, and init() again
once the job ended."""
import pytest

pytestmark = pytest.mark.integ

SCRIPT = """
import torch, torch.nn as nn, gradpress.torch as bps
from gradpress.torch.parallel import DistributedDataParallel
bps.init()
r, n = bps.rank(), bps.size()
assert n == 2

# integer averages are floor-divided sums, as BytePS's floor_divide_: (-1 + -2) / 2 -> -2, (3 + 4) / 2 -> 3
for dtype in (torch.int64, torch.int32, torch.int16):
    x = torch.tensor([-1 - r, 3 + r, -4, 5 * r], dtype=dtype)
    got = bps.push_pull(x, average=True, name=f"ints.{dtype}")
    assert got.dtype == dtype and got.tolist() == [-2, 3, -4, 2], (dtype, got)
    assert bps.push_pull(x, average=False, name=f"ints.{dtype}").tolist() == [-3, 7, -8, 5], dtype
    y = x.clone()
    bps.synchronize(bps.push_pull_async_inplace(y, average=True, name=f"inplace.{dtype}"))
    assert y.tolist() == [-2, 3, -4, 2], (dtype, y)
assert bps.declare("Gradient.anything") == 0
# bool counts as an integer: its sum is True where any worker's is, its average where every one's is
# (the average was the float 0.5 cast back: True, an OR)
flags = torch.tensor([True, r == 0, False])
assert bps.push_pull(flags, average=True, name="flags").tolist() == [True, False, False]
assert bps.push_pull(flags, average=False, name="flags").tolist() == [True, True, False]

# unnamed tensors broadcast twice, of other shapes the second time
first = [torch.full((3,), float(r)), torch.full((2, 2), float(r))]
bps.broadcast_parameters(first, root_rank=1)
assert all(torch.all(t == 1.0) for t in first), first
second = [torch.full((7,), float(r + 5)), torch.full((1,), float(r + 5), dtype=torch.float64)]
bps.broadcast_parameters(second, root_rank=0)
assert all(torch.all(t == 5.0) for t in second), second

# tied weights (an embedding and the output layer over one tensor): two keys of state_dict,
# broadcast as one; pushed twice, the second push read the root's value landed by the first
tied = nn.Sequential(nn.Embedding(6, 4), nn.Linear(4, 6, bias=False))
tied[1].weight = tied[0].weight
with torch.no_grad():
    tied[0].weight.fill_(float(r + 1))
bps.broadcast_parameters(tied.state_dict(), root_rank=0, prefix="Tied.")
assert torch.all(tied[0].weight == 1.0) and tied[1].weight is tied[0].weight, tied[0].weight
# overlapping views of one buffer (not the same tensor): broadcast one after the other
buf = torch.full((10,), float(r + 1))
bps.broadcast_parameters([("x", buf[:6]), ("y", buf[4:]), ("z", buf.view(2, 5)[:, 0])], root_rank=0, prefix="Overlap.")
assert torch.all(buf == 1.0), buf

# an optimizer whose learning rate a numpy schedule computed (numpy scalars in param_groups)
import numpy as np
sgd = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1, momentum=0.9)
sgd.param_groups[0]["lr"] = np.float64(0.5) * np.cos(np.float32(r))
bps.broadcast_optimizer_state(sgd, root_rank=0)
assert sgd.param_groups[0]["lr"] == 0.5, sgd.param_groups[0]["lr"]
# a tensor learning rate: the root's value, a tensor on the device type the root kept it on
adam = torch.optim.Adam(nn.Linear(2, 2).parameters(), lr=torch.tensor(0.01 * (r + 1)))
bps.broadcast_optimizer_state(adam, root_rank=0)
lr = adam.param_groups[0]["lr"]
assert torch.is_tensor(lr) and lr.device.type == "cpu" and torch.equal(lr, torch.tensor(0.01)), lr

# frozen parameters left out of named_parameters (fine-tuning); accumulation changed mid-run
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
for p in model[0].parameters():
    p.requires_grad_(False)
trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5), named_parameters=trainable)
frozen_before = model[0].weight.clone()
def grads_of(passes, step):
    # the gradient averaged over both workers' batches, on a copy without the optimizer's hooks
    ref = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    ref.load_state_dict(model.state_dict())
    for w in range(n):
        for k in range(passes):
            g = torch.Generator().manual_seed(100 * step + 10 * w + k)
            (ref(torch.randn(5, 4, generator=g)).pow(2).mean() / passes / n).backward()
    return [ref.get_parameter(name).grad for name, _ in trainable]
for step, passes in enumerate((1, 2, 2)):
    if step == 1:
        opt.set_backward_passes_per_step(2)
    want = grads_of(passes, step)
    opt.zero_grad()
    for k in range(passes):
        g = torch.Generator().manual_seed(100 * step + 10 * r + k)
        (model(torch.randn(5, 4, generator=g)).pow(2).mean() / passes).backward()
    opt.synchronize()
    for (name, p), w in zip(trainable, want):
        assert torch.allclose(p.grad, w, atol=1e-6), (step, name, (p.grad - w).abs().max())
    with opt.skip_synchronize():
        opt.step()
assert torch.equal(model[0].weight, frozen_before)
# step() after synchronize() without skip_synchronize(): pushed again, with a warning
# (Horovod's); a plain step() after backward, or one inside skip_synchronize(), warns of nothing
import warnings
opt.set_backward_passes_per_step(1)
for explicit, skip in ((True, False), (False, False), (True, True)):
    opt.zero_grad()
    model(torch.randn(5, 4)).pow(2).mean().backward()
    if explicit:
        opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if skip:
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    again = [w for w in caught if "skip_synchronize" in str(w.message)]
    assert len(again) == (explicit and not skip), (explicit, skip, [str(w.message) for w in caught])
try:
    bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=trainable[:1])
except ValueError as e:
    assert "trainable parameter(s) of the optimizer are missing from named_parameters" in str(e), e
else:
    raise AssertionError("a trainable parameter without a name was accepted")

# an optimizer whose zero_grad takes no argument, and a custom compressor on BytePS's base class
from gradpress.torch.compression import Compressor
class Plain(torch.optim.SGD):
    def zero_grad(self):
        super().zero_grad(set_to_none=False)
class Halves(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor.half(), tensor.dtype
    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx)
small = nn.Linear(3, 2)
plain = bps.DistributedOptimizer(Plain(small.parameters(), lr=0.0), named_parameters=small.named_parameters(),
                                 compression=Halves)
small(torch.full((1, 3), float(r))).sum().backward()
plain.step()
assert torch.equal(small.bias.grad, torch.ones(2)), small.bias.grad  # averaged, through the halves
plain.zero_grad()  # its own default: gradients zeroed, not dropped
assert all(p.grad is not None and not p.grad.any() for p in small.parameters())

# two DDP models in one job with the same parameter names and other shapes (a GAN's two)
def wrapped(width):
    torch.manual_seed(r)  # different on each worker: the constructor broadcasts rank 0's
    return DistributedDataParallel(nn.Sequential(nn.Linear(3, width), nn.Linear(width, 1)), bucket_cap_mb=1)
g_net, d_net = wrapped(6), wrapped(9)
assert [r.kind for r in g_net._gradpress._routes()] == [r.kind for r in d_net._gradpress._routes()] == ["bucket"]
for net in (g_net, d_net):
    net(torch.full((2, 3), float(r + 1))).sum().backward()
    grad = net.module[1].bias.grad
    assert torch.allclose(grad, torch.full((1,), 2.0)), grad  # every worker's bias gradient is 2
print("OK api", [float(p.sum()) for p in list(g_net.parameters()) + list(d_net.parameters())], flush=True)
bps.shutdown()

# init() once the job ended: its deadline says that this call joins a new job nobody started
# (it said only "no address book from the scheduler"); at a port nobody listens on (the old
# scheduler may still be there, waiting for the servers' last acknowledgements)
import os, socket
from gradpress.errors import JobError
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    os.environ["DMLC_PS_ROOT_PORT"] = str(s.getsockname()[1])
os.environ["GRADPRESS_CONNECT_TIMEOUT_S"] = "1"
try:
    bps.init()
except JobError as e:
    assert "left its job before (shutdown() or suspend())" in str(e), e
    print("OK rejoin", flush=True)
"""


def test_byteps_api_details_across_workers(cluster):
    c = cluster(workers=2, servers=1)
    c.start(SCRIPT).assert_success()
    lines = [next(line for line in c.log(f"worker {i}").splitlines() if line.startswith("OK api")) for i in range(2)]
    assert lines[0] == lines[1], lines  # both DDP models start from rank 0's parameters and stay equal
    assert all("OK rejoin" in c.log(f"worker {i}") for i in range(2)), c.log("worker 0")[-3000:]
