"""Uncompressed device arrays through a real job under Numba's CUDA simulator: the worker
copies each partition from the device into the shared push segment (or, without shared
memory, into a pinned buffer of the key's own pushed as frames), and the result goes back
to the device and is divided there. Sums and averages of float16/32/64 must be the host
path's bits, round after round, with partitions split over two servers."""
import pytest

pytestmark = pytest.mark.integ

SCRIPT = """
import os, numpy as np
from numba import cuda
from gradpress.config import Settings
from gradpress.kernels.cpu import fp16
from gradpress.worker import WorkerClient
c = WorkerClient(Settings.load(os.environ))
c.start()
r, n = c.rank, c.size
assert all(c.comm.stages.local) == (os.environ["GRADPRESS_SHM"] == "1")
for dtype in ("float32", "float16", "float64"):
    for step in range(2):
        host = [np.random.default_rng(100 * w + step).standard_normal(1100).astype(dtype) for w in range(n)]
        total = host[0].copy()
        for h in host[1:]:  # the servers add in float32 for float16, in the dtype otherwise
            total = (total.astype(np.float32) + h).astype(dtype) if dtype == "float16" else total + h
        want = np.empty_like(total)
        if dtype == "float16":
            fp16.divide_half(total, n, want)
        else:
            np.divide(total, n, out=want)
        src = cuda.to_device(host[r])
        out = cuda.device_array_like(src)
        c.push_pull_async(f"{dtype}", src, out, n, 0).result(60)
        got = out.copy_to_host()
        assert got.tobytes() == want.tobytes(), (dtype, step, np.abs(got - want).max())
        summed = cuda.to_device(host[r])
        c.push_pull_async(f"{dtype}.sum", summed, summed, 1, 0).result(60)
        assert summed.copy_to_host().tobytes() == total.tobytes(), (dtype, step, "sum")
print("OK", r, flush=True)
c.finish()
"""


@pytest.mark.parametrize("shm", ["1", "0"])
def test_uncompressed_device_arrays_move_by_copies_and_land_divided_on_the_device(cluster, shm):
    c = cluster(workers=2, servers=2, env={"NUMBA_ENABLE_CUDASIM": "1", "GRADPRESS_SHM": shm,
                                           "BYTEPS_PARTITION_BYTES": "1024"})
    c.start(SCRIPT).assert_success(120)
    for w in range(2):
        assert "OK" in c.log(f"worker {w}"), c.log(f"worker {w}")
