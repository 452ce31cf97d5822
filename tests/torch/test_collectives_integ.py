"""allgather, allgather_object, a differentiable push_pull, broadcast_object of any
picklable object, and byteps_push_pull, across real worker processes."""
import pytest

pytestmark = pytest.mark.integ

COLLECTIVES = """
import argparse, os, torch, gradpress.torch as bps
from gradpress.torch.objects import ObjectError
bps.init()
r, n = bps.rank(), bps.size()

# allgather: uneven first dimensions, concatenated in rank order, dtype kept
mine = torch.arange(3 * (r + 1) * 2, dtype=torch.float32).view(3 * (r + 1), 2) + 100 * r
got = bps.allgather(mine, name="rows")
want = torch.cat([torch.arange(3 * (w + 1) * 2, dtype=torch.float32).view(3 * (w + 1), 2) + 100 * w
                  for w in range(n)])
assert got.dtype == torch.float32 and torch.equal(got, want), (got, want)
ints = bps.allgather(torch.tensor([r] * (r + 1), dtype=torch.int64))
assert ints.dtype == torch.int64 and ints.tolist() == [w for w in range(n) for _ in range(w + 1)], ints
big = 2**53 + 1  # beyond float64's integers: int64 is gathered by its 32-bit words, exactly
wide = bps.allgather(torch.full((r + 1, 2), big + r), name="big")
assert wide.dtype == torch.int64 and wide.tolist() == [[big + w] * 2 for w in range(n) for _ in range(w + 1)], wide
assert bps.allgather(torch.tensor([complex(r, -r)])).tolist() == [complex(w, -w) for w in range(n)]
try:  # a worker gathering other rows fails at once, not after GRADPRESS_OP_TIMEOUT_S
    bps.allgather(torch.ones(2, 3 if r == 0 else 4), name="uneven-rows")
    raise AssertionError("rows of other shapes were gathered")
except ValueError as e:
    assert f"rows of ({3 if r == 0 else 4},) float32" in str(e) and "worker(s) [" in str(e), e
again = bps.allgather(mine + 1, name="rows")  # a recurring shape: the same keys, the next round
assert torch.equal(again, want + 1)
assert bps.allgather_object({"rank": r, "tag": "x" * r}) == [{"rank": w, "tag": "x" * w} for w in range(n)]
# a worker whose object does not pickle, or is too large, fails every worker in this call:
# alone, it would have left the others pairing this call with its next one
for bad, why in (((lambda: 1), "does not pickle"), ("x" * 3000, "pickles to 3018 bytes, over max_bytes=2000")):
    try:
        bps.allgather_object(bad if r == 1 else r, max_bytes=2000)
        raise AssertionError("an allgather_object with a bad object went through")
    except ObjectError as e:
        assert "worker(s) [1] could not send their object" in str(e) and (why in str(e)) == (r == 1), e
assert bps.allgather_object(r) == list(range(n))  # the next call pairs with the next call

# push_pull is differentiable: the backward is the push_pull of the gradients
x = torch.full((4,), float(r + 1), requires_grad=True)
y = bps.push_pull(x * 2, average=True, name="diff")
assert torch.allclose(y, torch.full((4,), 2.0 * sum(range(1, n + 1)) / n))
(y * (r + 1)).sum().backward()
# dL_r/dx_r = 2 * mean over workers w of (w + 1)
assert torch.allclose(x.grad, torch.full((4,), 2.0 * sum(range(1, n + 1)) / n)), x.grad
z = torch.ones(3, requires_grad=True)
bps.push_pull(z, average=False, name="summed").sum().backward()
assert torch.equal(z.grad, torch.full((3,), float(n)))

# broadcast_object: any picklable object, from the root
ns = bps.broadcast_object(argparse.Namespace(lr=0.1, layers=[1, 2], rank=r) if r == 0 else None, root_rank=0)
assert isinstance(ns, argparse.Namespace) and ns.lr == 0.1 and ns.layers == [1, 2] and ns.rank == 0, ns
# a root whose object cannot be sent fails every worker with its reason (none waits)
cases = [((lambda: 1) if r == 0 else None, "does not pickle"), (b"x" * 5000 if r == 0 else None, "over max_bytes")]
for bad, why in cases:
    try:
        bps.broadcast_object(bad, root_rank=0, max_bytes=1000)
        raise SystemExit("no error")
    except ObjectError as e:
        assert why in str(e) and "rank 0" in str(e), e

# byteps_push_pull is BytePS's top-level name of push_pull_async_inplace
t = torch.full((5,), float(r))
assert torch.equal(bps.synchronize(bps.byteps_push_pull(t, average=False, name="alias")),
                   torch.full((5,), float(sum(range(n)))))
print("OK collectives", flush=True)
bps.shutdown()
"""


def run_to_the_end(cluster, script: str, workers: int, servers: int, said: str) -> None:
    """``script`` on every worker of a job, each of which ends by printing ``said``."""
    c = cluster(workers=workers, servers=servers)
    c.start(script).assert_success()
    for w in range(workers):
        assert said in c.log(f"worker {w}"), c.logs()


def test_allgather_autograd_push_pull_and_broadcast_object(cluster):
    run_to_the_end(cluster, COLLECTIVES, 3, 2, "OK collectives")


BYTEPS_ALLGATHER = """
import itertools, torch, gradpress.torch as bps
bps.init()
r, n = bps.rank(), bps.size()

def made(seed, shape, dtype):
    if dtype == torch.bool:
        return torch.ones(shape, dtype=dtype)
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)

for same_shape in (True, False):  # BytePS's bccl test cases: 1-3 dimensions, bool and float32
    for it, (dtype, dim) in enumerate(itertools.product((torch.bool, torch.float32), (1, 2, 3))):
        shape = [10] * dim
        mine = shape if same_shape else [shape[0] + r] + shape[1:]
        got = bps.allgather(made(r, mine, dtype), same_shape=same_shape, name=f"ag.{same_shape}.{it}")
        want = torch.cat([made(w, shape if same_shape else [shape[0] + w] + shape[1:], dtype) for w in range(n)])
        assert got.dtype == dtype and torch.equal(got, want), (same_shape, dtype, dim)
        summed = bps.push_pull(made(r, shape, torch.float32), average=False, name=f"ar.{same_shape}.{it}")
        assert torch.allclose(summed, sum(made(w, shape, torch.float32) for w in range(n))), "push_pull beside it"
    # autograd: each worker's gradient is its own slice of the averaged output gradient
    x = made(r, [10] if same_shape else [10 + r], torch.float32).requires_grad_()
    y = bps.allgather(x, same_shape=same_shape, name=f"ag.grad.{same_shape}")
    (y * y).backward(torch.ones_like(y))
    assert torch.allclose(x.grad, 2 * x.detach()), (x.grad, x)
# torch.distributed's form: a list of outputs, one per worker
outs = [torch.zeros(2, 3) for _ in range(n)]
back = bps.allgather(outs, torch.full((2, 3), float(r)), name="into")
assert back is outs and all(torch.equal(o, torch.full((2, 3), float(w))) for w, o in enumerate(outs)), outs
scalars = [torch.zeros(()) for _ in range(n)]
bps.allgather(scalars, torch.tensor(float(r) + 0.5), name="scalars")
assert [float(s) for s in scalars] == [w + 0.5 for w in range(n)], scalars
try:
    bps.allgather([torch.zeros(3)] * n, torch.zeros(2, 3), name="wrong")
    raise SystemExit("an output of the wrong shape was accepted")
except ValueError as e:
    assert "outputs[0] has shape (3,)" in str(e), e
print("OK byteps allgather", flush=True)
bps.shutdown()
"""


def test_byteps_allgather_cases_same_and_uneven_autograd_and_the_output_list(cluster):
    run_to_the_end(cluster, BYTEPS_ALLGATHER, 3, 2, "OK byteps allgather")


EDGES = """
import torch, gradpress.torch as bps
from gradpress.torch.objects import ObjectError
bps.init()
r, n = bps.rank(), bps.size()
def tensors():
    return len(bps.ops.client().tensors)

# a differentiable allgather called again with another total (an epoch's last, smaller batch)
for rows in (2, 3, 2):
    x = torch.ones(rows + r, 2, requires_grad=True)
    bps.allgather(x).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x)), (rows, x.grad)
# -0.0 keeps its sign; int64 of a last stride other than 1; a conjugated complex tensor
assert torch.signbit(bps.allgather(torch.tensor([-0.0, 1.0]), name="signs")).tolist() == [True, False] * n
column = torch.tensor([[r, r + 1, 2**40 + r]]).T   # shape (3, 1), strides (1, 3)
assert bps.allgather(column, name="column").tolist() == [[v] for w in range(n) for v in (w, w + 1, 2**40 + w)]
assert bps.allgather(torch.tensor([complex(r, 1)]).conj(), name="conj").tolist() == [complex(w, -1) for w in range(n)]
# calls of one name whose sizes vary reuse a few keys, not one (or two) a call
def declared(name):
    return len([t for t in bps.ops.client().tensors if name in t])
for again in (False, True):
    before = tensors()
    for i in range(12):
        assert bps.broadcast_object({"epoch": i, "pad": "x" * (100 * i)}, root_rank=0, name="meta")["epoch"] == i
        objects = bps.allgather_object("y" * (i + 100 + 20 * r), name="sizes")
        assert objects == ["y" * (i + 100 + 20 * w) for w in range(n)]
        got = bps.allgather(torch.full((i + r + 1,), float(r)), name="vary")
        assert got.tolist() == [float(w) for w in range(n) for _ in range(i + w + 1)]
    assert not again or tensors() == before, f"{tensors() - before} tensors declared by the same calls again"
assert declared("Object.sizes") <= 4, f"{declared('Object.sizes')} tensors of allgather_object within an octave"
# an object the receivers cannot unpickle: an error naming its sender
if r == 0:
    class Local:  # a class of the root's __main__ alone
        pass
try:
    got = bps.broadcast_object(Local() if r == 0 else None, root_rank=0, name="local")
    assert r == 0 and isinstance(got, Local), got   # the root keeps its own object
except ObjectError as e:
    assert r != 0 and "from the root (rank 0) does not unpickle" in str(e), e
print("OK edges", flush=True)
bps.shutdown()
"""


def test_allgather_and_objects_at_their_edges(cluster):
    run_to_the_end(cluster, EDGES, 2, 1, "OK edges")
