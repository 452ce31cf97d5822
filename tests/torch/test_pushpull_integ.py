"""push_pull across real worker and server processes: sums, averages, shapes, dtypes, async."""

import pytest

pytestmark = pytest.mark.integ

# Every worker checks every case itself; a failing assert names the case and exits non-zero.
SHAPES_AND_DTYPES = """
import itertools, torch, gradpress.torch as bps
bps.init()
r, n = bps.rank(), bps.size()
total = n * (n - 1) / 2  # sum of ranks
shapes = [(), (1,), (7,), (3, 5, 2), (0,), (10000,), (129, 77)]  # (10000,) spans 10 partitions of 4 KB
dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64]
for rnd, (shape, dtype) in enumerate(itertools.product(shapes, dtypes)):
    base = torch.arange(int(torch.tensor(shape).prod().item()) if shape else 1).reshape(shape)
    x = (base % 13 + r).to(dtype)
    want = (base % 13) * n + total
    name = f"t{shape}{dtype}"
    got = bps.push_pull(x, average=False, name=name)
    assert got.dtype == dtype and got.shape == x.shape, (name, got.dtype, got.shape)
    assert torch.equal(got.double(), want.double()), (name, "sum", got, want)
    assert torch.equal(x, (base % 13 + r).to(dtype)), (name, "out-of-place push_pull changed its input")
    if dtype.is_floating_point:
        avg = bps.push_pull(x, average=True, name=name)  # same key, next round
        rtol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
        assert torch.allclose(avg.double(), want.double() / n, rtol=rtol), (name, "avg")
# complex tensors: real and imaginary parts summed apart (out of place, and in place)
z = torch.complex(torch.arange(7.) + r, -2 * torch.arange(7.) - r)
got = bps.push_pull(z, average=False, name="complex64")
assert got.dtype == torch.complex64 and got.shape == z.shape, got
assert torch.equal(got, torch.complex(n * torch.arange(7.) + total, -2 * n * torch.arange(7.) - total)), got
w = torch.full((3, 2), complex(r, 1), dtype=torch.complex128)
assert bps.push_pull_inplace(w, average=True, name="complex128") is w
assert torch.equal(w, torch.full((3, 2), complex(total / n, 1), dtype=torch.complex128)), w
# float16/bfloat16 with compression_params: compressed widened to float32, averages narrowed back
for dtype in (torch.float16, torch.bfloat16):
    h = (torch.arange(40000) % 5 - 2 + r).to(dtype)
    got = bps.push_pull(h, name=f"half.{dtype}", compression_params={"compressor": "fp16"})
    assert got.dtype == dtype and torch.equal(got, ((torch.arange(40000) % 5 - 2) + total / n).to(dtype)), got
    signs = bps.push_pull(h[:1000], name=f"half.onebit.{dtype}",  # one partition (4000 bytes widened)
                          compression_params={"compressor": "onebit", "scaling": True})
    assert signs.dtype == dtype and signs.abs().unique().numel() == 1, signs.unique()  # one magnitude: onebit's
# a NaN on worker 1 under error feedback: that round is skipped on every worker at once (worker 1
# still pushes, nonfinite), NaN everywhere, and the next round is every worker's next round, whole
onebit_ef = {"compressor": "onebit", "ef": "vanilla"}
skipped = bps.push_pull(torch.full((1000,), float("nan") if r == 1 else 1.0), average=False, name="nan-round",
                        compression_params=onebit_ef)
assert torch.isnan(skipped).all(), skipped
after = bps.push_pull(torch.full((1000,), float(r + 1)), average=False, name="nan-round",
                      compression_params=onebit_ef)
assert torch.equal(after, torch.ones(1000)), after.unique()  # every sign +1, onebit's scale 1
# int64 beyond float64's integers, and a sum that wraps as torch's int64 addition does
big = torch.tensor([2**53 + 1 + r, -(2**62), 2**62 + r], dtype=torch.int64)
want = [n * (2**53 + 1) + int(total), -n * 2**62, n * 2**62 + int(total)]
got = bps.push_pull(big, average=False, name="int64.big")
assert got.tolist() == [(v + 2**63) % 2**64 - 2**63 for v in want], (got, want)
# uint64's average: the sum modulo 2**64 floor-divided (torch divides no uint64 itself)
u = torch.tensor([2**64 - 1 - r, 2**63 + r, 5 + r], dtype=torch.uint64)
values = [[2**64 - 1 - k, 2**63 + k, 5 + k] for k in range(n)]
want = [(sum(v[i] for v in values) % 2**64) // n for i in range(3)]
got = bps.push_pull(u, average=True, name="uint64.avg")
assert got.dtype == torch.uint64 and got.view(torch.int64).tolist() == [(v + 2**63) % 2**64 - 2**63 for v in want]
# several rounds of one tensor in flight at once, in place, never mixing
xs = [torch.full((5000,), float(10 * k + r)) for k in range(4)]
handles = [bps.push_pull_async_inplace(x, average=False, name="rounds") for x in xs]
for k, h in enumerate(handles):
    out = bps.synchronize(h)
    assert torch.all(out == 10 * k * n + total), ("rounds", k, out[:3])
# many tensors in flight, with priorities, beyond the credit
hs = {j: bps.push_pull_async(torch.full((300 + j,), float(j + r)), average=True, name=f"many{j}", priority=j % 3)
      for j in range(40)}
for j, h in hs.items():
    assert not isinstance(h, bool) and bps.poll(h) in (True, False)
    assert torch.allclose(bps.synchronize(h), torch.full((300 + j,), j + total / n)), ("many", j)
print("OK rank", r, flush=True)
bps.shutdown()
"""


@pytest.mark.parametrize("workers,servers,shm", [(2, 1, "1"), (3, 2, "1"), (2, 2, "0")],
                         ids=["2w1s-shm", "3w2s-shm", "2w2s-tcp"])
def test_sum_and_average_over_shapes_dtypes_and_partitions(cluster, workers, servers, shm):
    c = cluster(workers=workers, servers=servers, env={"BYTEPS_PARTITION_BYTES": "4096", "BYTEPS_LOG_LEVEL": "INFO",
                                                        "BYTEPS_SCHEDULING_CREDIT": "3", "GRADPRESS_SHM": shm})
    c.start(SHAPES_AND_DTYPES).assert_success()
    for i in range(workers):
        assert f"OK rank {i}" in c.log(f"worker {i}")
    for i in range(servers):  # the default where servers share the host's cores with the workers
        assert "serving on port" in c.log(f"server {i}") and "the sums on its I/O thread" in c.log(f"server {i}")


ASYNC = """
import torch, gradpress.torch as bps
from gradpress.torch import ops
bps.init()
r, n = bps.rank(), bps.size()
seen = []
for i in range(5):
    seen.append(bps.push_pull(torch.ones(1000), average=False, name="w")[0].item())
# every pull returns the store as it is: it grows, and holds at least this worker's own pushes
assert seen == sorted(seen) and seen[-1] >= 5, seen
ops.client().barrier()
final = bps.push_pull(torch.zeros(1000), average=False, name="w")
assert torch.all(final == 5 * n), final[:3]
print("OK async", seen, flush=True)
bps.shutdown()
"""


def test_async_mode_adds_pushes_at_once_and_pulls_read_the_store(cluster):
    c = cluster(workers=2, servers=1, env={"BYTEPS_ENABLE_ASYNC": "1"})
    c.start(ASYNC).assert_success()
    assert "OK async" in c.log("worker 0")


CROSSED_ORDER = """
import torch, gradpress.torch as bps
bps.init()
r = bps.rank()
names = [f"t{i}" for i in range(6)]
for n in names:  # declared alike, then started in opposite orders, as gradient hooks may fire
    bps.push_pull(torch.zeros(1000), name=n)
order = names if r == 0 else names[::-1]
handles = {n: bps.push_pull_async(torch.full((1000,), float(r + 1)), average=False, name=n) for n in order}
for n, h in handles.items():
    assert torch.all(bps.synchronize(h) == 3), n
print("OK crossed", flush=True)
bps.shutdown()
"""


def test_credit_never_deadlocks_workers_that_start_tensors_in_different_orders(cluster):
    # credit counts pushes on the wire, not rounds waiting for the other workers' pushes
    c = cluster(workers=2, servers=1, env={"BYTEPS_SCHEDULING_CREDIT": "1", "GRADPRESS_OP_TIMEOUT_S": "10"})
    c.start(CROSSED_ORDER).assert_success(60)
    assert "OK crossed" in c.log("worker 0")


RELEASE = """
import numpy as np, torch, gradpress.torch as bps
from gradpress.torch import ops
bps.init()
r, client = bps.rank(), ops.client()
params = {"compressor": "onebit", "ef": "vanilla"}
x = torch.linspace(-1, 1, 3000) * (r + 1)
raw = torch.arange(5000.0)  # uncompressed, co-located: pushed and pulled through shared memory
for _ in range(2):
    bps.push_pull(x.clone(), average=True, name="t", compression_params=params)
    assert torch.equal(bps.push_pull(raw * (r + 1), average=False, name="raw"), raw * 3)
regions = [(wk.push_region.chunk.inode, wk.push_region.offset) for wk in client.tensor("raw").keys]
if r == 0:
    residual, _ = client.server_state("t")[0]
    assert residual is not None and np.abs(residual).sum() > 0, "the server kept no residual"
client.barrier()
client.release(["t", "raw"], servers=r == 0)  # every worker its own side; rank 0 the servers'
client.barrier()
assert client.tensor("t") is None
# a tensor of the same size takes the released shared memory, here and on the server, and sums right
for k in range(2):
    assert torch.equal(bps.push_pull(raw * (r + 2 + k), average=False, name="raw2"), raw * (5 + 2 * k))
assert [(wk.push_region.chunk.inode, wk.push_region.offset) for wk in client.tensor("raw2").keys] == regions
# the same name again: the same keys, and the servers start them afresh (no residual yet)
got = bps.push_pull(x.clone(), average=True, name="t", compression_params=params)
if r == 0:
    fresh = bps.push_pull(x.clone(), average=True, name="u", compression_params=params)
    assert torch.equal(got, fresh), "the released key's old state leaked into its new round"
else:
    bps.push_pull(x.clone(), average=True, name="u", compression_params=params)
print("OK rank", r, flush=True)
"""


def test_a_released_tensor_starts_afresh_on_its_servers(cluster):
    """release(): a tensor every worker has left is forgotten by the workers and (told by one
    of them) by its servers: declared again, its keys start with no error-feedback residual."""
    c = cluster(workers=2, servers=1)
    c.start(RELEASE).assert_success(120)
