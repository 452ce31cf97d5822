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
client = ops.client()
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
