"""Row-sparse push_pull across real worker and server processes (issue 15).

Each worker computes every worker's input itself (they are functions of the rank), so it
checks the union it pulls against a numpy reference, exactly: the values are multiples
of 1/4 well inside float16's range, whose sums are exact in any order. The training part
checks that a sparse embedding ends bit-identical on every worker and equal, to float32
rounding, to the same training sent dense.
"""
import json

import pytest

pytestmark = pytest.mark.integ

SUMS = """
import json, os, numpy as np, torch, gradpress.torch as bps
from gradpress.torch import ops
bps.init()
r, n = bps.rank(), bps.size()
ROWS, WIDTH = 1001, 3  # 1001 rows: not a multiple of 2 or 3 servers

def batch(case, rank):
    rng = np.random.default_rng([rank, len(case)])
    if case == "empty":            # worker 0 touched no row; with one worker, nobody did
        ids = [] if rank == 0 else [5, 17]
    elif case == "all-empty":
        ids = []
    elif case == "ends":
        ids = [0, ROWS - 1]
    elif case == "same-row":
        ids = [7]
    elif case == "disjoint":
        ids = list(range(rank, ROWS, n))
    elif case == "duplicates":     # one row several times within a push: summed, as coalesce() does
        ids = [3, 0, 3, ROWS - 1, 3, 0]
    elif case == "zipf":
        ids = list((rng.zipf(1.1, 300) - 1) % ROWS)
    vals = rng.integers(-40, 40, (len(ids), WIDTH)) / 4
    return np.array(ids, np.int64), vals

def reference(case):
    dense = np.zeros((ROWS, WIDTH))
    for k in range(n):
        ids, vals = batch(case, k)
        np.add.at(dense, ids, vals)
    touched = sorted({int(i) for k in range(n) for i in batch(case, k)[0]})
    return np.array(touched, np.int64), dense

report = {}
for rnd in range(2):  # a second round of each name: replies may be bitmaps over known rows
    for case in ["empty", "all-empty", "ends", "same-row", "disjoint", "duplicates", "zipf"]:
        for dtype in (torch.float32, torch.float16):
            ids, vals = batch(case, r)
            x = torch.sparse_coo_tensor(torch.from_numpy(ids).view(1, -1), torch.from_numpy(vals).to(dtype),
                                        (ROWS, WIDTH))
            got = bps.push_pull(x, average=False, name=f"{case}.{dtype}")
            want_rows, want_dense = reference(case)
            assert got.is_sparse and got.is_coalesced() and got.dtype == dtype, (case, dtype, got)
            assert torch.equal(got._indices()[0], torch.from_numpy(want_rows)), (case, dtype, "rows")
            assert np.array_equal(got._values().double().numpy(), want_dense[want_rows]), (case, dtype, "sums")
            avg = bps.push_pull(x, average=True, name=f"{case}.{dtype}")
            assert np.allclose(avg.to_dense().double().numpy(), want_dense / n, rtol=1e-3), (case, dtype, "avg")
# a dense gradient sent as its non-zero rows: the dense sum, zero elsewhere
ids, vals = batch("zipf", r)
dense = torch.zeros(ROWS, WIDTH)
dense.index_put_((torch.from_numpy(ids),), torch.from_numpy(vals).float(), accumulate=True)
out = bps.synchronize(ops.push_pull_rows_async_inplace(dense, average=False, name="dense-rows"))
assert out is dense and np.array_equal(dense.double().numpy(), reference("zipf")[1]), "dense rows"
def conv_of(k):  # a conv weight's gradient, rows by worker
    t = torch.zeros(ROWS, 2, 2, 2)
    t[torch.from_numpy(np.unique(batch("zipf", k)[0]))] = torch.arange(8.0).view(2, 2, 2) + k
    return t
conv = conv_of(r).to(memory_format=torch.channels_last)  # rows that no flat view reaches
out = bps.synchronize(ops.push_pull_rows_async_inplace(conv, average=False, name="conv-rows"))
assert out is conv and torch.equal(conv, sum(conv_of(k) for k in range(n))), "channels_last rows"
assert conv.is_contiguous(memory_format=torch.channels_last), "the gradient's layout changed"
try:  # a layout that cannot travel is named, not met by torch's own error deep inside
    bps.push_pull(torch.eye(3).to_sparse_csr(), name="csr")
    raise AssertionError("a CSR tensor was pushed")
except ValueError as e:
    assert "a torch.sparse_csr tensor; dense (strided) or sparse COO tensors expected" in str(e), e
# rows found later, on the row finder's thread (a GPU gradient's way): the call returns before
# they are found; a failure to find them fails the future, naming the tensor, and nothing else
import threading
from gradpress.torch.sparse import layout_of
from gradpress.worker.sparse import coalesce
client = ops.client()
layout = layout_of(torch.zeros(ROWS, WIDTH), client, 0)
release, finders = threading.Event(), []
def find():
    finders.append(threading.current_thread().name)
    assert release.wait(30), "never released"
    ids, vals = batch("zipf", r)
    return coalesce(ids, vals.astype(np.float32), ROWS, "push_pull of 'later'")
later = client.push_pull_sparse_later("later", find, layout, 1, 0)
assert not later.done(), "the rows were found before the test let them be"
release.set()
union = later.result(30).rows()
want_rows, want_dense = reference("zipf")
assert np.array_equal(union.indices, want_rows) and np.array_equal(union.values, want_dense[want_rows]), "later"
assert finders == ["gp-row-finder"], finders
def lost():
    raise OSError("an illegal memory access was encountered")
try:
    client.push_pull_sparse_later("lost", lost, layout, 1, 0).result(30)
    raise AssertionError("rows never found were pushed")
except RuntimeError as e:
    assert "push_pull of sparse tensor 'lost': finding its rows failed: OSError: an illegal memory" in str(e), e
def out_of_range():
    return coalesce(np.array([ROWS]), np.zeros((1, WIDTH), np.float32), ROWS, "push_pull of 'bad'")
try:
    client.push_pull_sparse_later("bad", out_of_range, layout, 1, 0).result(30)
    raise AssertionError("a row out of range was pushed")
except ValueError as e:
    assert str(e) == f"push_pull of 'bad': row index {ROWS} is out of range for a table of {ROWS} rows", e
report["pushed"], report["pulled"] = client.bytes_pushed, client.bytes_pulled
json.dump(report, open(os.path.join(os.environ["GP_TEST_DIR"], f"sums{r}.json"), "w"))
print("OK rank", r, flush=True)
bps.shutdown()
"""


@pytest.mark.parametrize("workers,servers", [(2, 1), (3, 2)], ids=["2w1s", "3w2s"])
def test_sparse_sums_equal_numpy(cluster, workers, servers):
    c = cluster(workers=workers, servers=servers)
    c.start(SUMS).assert_success()
    for i in range(workers):
        assert f"OK rank {i}" in c.log(f"worker {i}")


TRAIN = """
import copy, hashlib, json, os, numpy as np, torch, gradpress.torch as bps
from torch import nn
bps.init()
r, n = bps.rank(), bps.size()
AUTO = json.loads(os.environ.get("GP_AUTO", "null"))  # the planner's options, or none

class Model(nn.Module):
    def __init__(self, sparse):
        super().__init__()
        self.emb = nn.Embedding(300, 8, sparse=sparse)
        self.bag = nn.EmbeddingBag(200, 8, mode="sum", sparse=sparse)
        self.head = nn.Linear(16, 1)
    def forward(self, ids, bag_ids, offsets, use_bag=True):
        bags = self.bag(bag_ids, offsets) if use_bag else torch.zeros(len(offsets), 8)
        return self.head(torch.cat([self.emb(ids), bags], 1)).squeeze(1)

def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    ids = (torch.rand(16, generator=g) ** 3 * 300).long()                    # skewed towards row 0
    ids[0] = 0 if rank == 0 else 299                                          # first and last rows
    bag_ids = torch.randint(0, 200, (48,), generator=g)
    bag_ids[:3] = 5                                                           # one row thrice in a bag
    return ids, bag_ids, torch.arange(0, 48, 3), torch.randn(16, generator=g)

torch.manual_seed(0)
sparse_model = Model(sparse=True)
dense_rows_model = Model(sparse=False)              # dense gradients, found mostly zero rows
dense_rows_model.load_state_dict(sparse_model.state_dict())
reference = copy.deepcopy(dense_rows_model)        # trained alone on every worker's batches, dense
opts = {}
for label, model in (("sparse", sparse_model), ("dense-rows", dense_rows_model)):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    named = [(label + "." + k, v) for k, v in model.named_parameters()]
    opts[label] = bps.DistributedOptimizer(opt, named_parameters=named, compression_params=AUTO)
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
# a model of nothing but a sparse table: under compressor auto the planner has nothing to plan
solo = nn.Embedding(300, 8, sparse=True)
solo_ref = copy.deepcopy(solo)
solo_opt = bps.DistributedOptimizer(torch.optim.SGD(solo.parameters(), lr=0.05),
                                    named_parameters=[("solo.weight", solo.weight)], compression_params=AUTO)
solo_ref_opt = torch.optim.SGD(solo_ref.parameters(), lr=0.05)
torch.manual_seed(1)
for step in range(6):
    solo_opt.zero_grad()
    ids, _, _, y = batch(step, r)
    ((solo(ids).sum(1) - y) ** 2).mean().backward()
    solo_opt.step()
    solo_ref_opt.zero_grad()
    for k in range(n):
        ids, _, _, y = batch(step, k)
        (((solo_ref(ids).sum(1) - y) ** 2).mean() / n).backward()
    solo_ref_opt.step()
    for label, model in (("sparse", sparse_model), ("dense-rows", dense_rows_model)):
        ids, bag_ids, offsets, y = batch(step, r)
        use_bag = (step, r) != (3, 1)  # worker 1 leaves the bag out once: its gradient never comes
        opts[label].zero_grad()
        ((model(ids, bag_ids, offsets, use_bag) - y) ** 2).mean().backward()
        if label == "sparse":
            assert model.emb.weight.grad.is_sparse and (model.bag.weight.grad is None) != use_bag
        opts[label].step()
        if label == "sparse":
            assert model.emb.weight.grad.is_sparse, "the averaged gradient stays sparse"
    ref_opt.zero_grad()
    for k in range(n):
        ids, bag_ids, offsets, y = batch(step, k)
        (((reference(ids, bag_ids, offsets, (step, k) != (3, 1)) - y) ** 2).mean() / n).backward()
    ref_opt.step()
routed = opts["dense-rows"]._gradpress._vote.decided
assert sorted(routed.values()) == [True, True], routed  # both tables go row-sparse (the 1-row head is not a candidate)
if AUTO:  # the planner left the tables to the rows path and planned the head alone
    for label, opt in opts.items():
        assert opt.gradpress_plan is not None, label
        planner = opt._gradpress.planner
        planned = sorted(opt._gradpress.table.names[id(p)] for p in planner.params)
        assert planned == [label + ".head.bias", label + ".head.weight"], planned
        assert all(".head." in g.name for g in planner.route.groups), [g.name for g in planner.route.groups]
    assert solo_opt._gradpress.planner.params == [] and solo_opt.gradpress_plan is None
assert torch.allclose(solo.weight, solo_ref.weight, rtol=1e-5, atol=1e-6), (solo.weight - solo_ref.weight).abs().max()
digest = {}
for label, model in (("sparse", sparse_model), ("dense-rows", dense_rows_model)):
    for (k, v), (_, want) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.allclose(v, want, rtol=1e-5, atol=1e-6), (label, k, (v - want).abs().max())
    digest[label] = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.state_dict().values())).hexdigest()
digest["solo"] = hashlib.sha256(solo.weight.detach().numpy().tobytes()).hexdigest()
json.dump(digest, open(os.path.join(os.environ["GP_TEST_DIR"], f"train{r}.json"), "w"))
print("OK rank", r, flush=True)
bps.shutdown()
"""


@pytest.mark.parametrize("auto", [None, {"compressor": "auto", "allowed": ["none"]}], ids=["fixed", "auto"])
def test_sparse_embeddings_train_bit_identically_and_as_dense_training(cluster, auto):
    """With ``compressor: auto`` too: the planner leaves row-sparse gradients (sparse COO, and
    dense ones found mostly zero rows) to the rows path, and plans the rest."""
    env = {"GP_AUTO": json.dumps(auto), "GRADPRESS_PLAN_STEPS": "2"} if auto else {}
    c = cluster(workers=2, servers=2, env=env)
    c.start(TRAIN).assert_success()
    digests = [json.loads((c.tmp / f"train{i}.json").read_text()) for i in range(2)]
    assert digests[0] == digests[1], "workers' parameters differ"
