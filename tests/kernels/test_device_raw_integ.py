"""Uncompressed device arrays through a real job under Numba's CUDA simulator: the worker
copies each partition from the device into the shared push segment (or, without shared
memory, into a pinned buffer of the key's own pushed as frames), and the result goes back
to the device and is divided there. Sums and averages of float16/32/64 must be the host
path's bits, round after round, with partitions split over two servers; a compressed
round skipped for a NaN lands NaN on the device, and the next is a first round's bits; and the same
through local reduction (2 machines of 2 workers), where an owner copies its own device
partition to the host before summing, and onebit's payload is decoded on each device."""
import pytest
from simulated import JOB_PREAMBLE

pytestmark = pytest.mark.integ

SCRIPT = JOB_PREAMBLE + """
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
# a NaN on worker 1's device under error feedback: its partition's round is skipped, NaN lands
# there on every device, and the next round starts that key's state again: a first round's bits
# (the others' residuals went on, so only that partition is compared)
from first_round import first_round
from gradpress.compressors.spec import CodecSpec
params = {"compressor": "onebit", "scaling": True, "ef": "vanilla"}
spec = CodecSpec.from_params(params, "test")
host = [np.random.default_rng(7 + w).standard_normal(1100).astype(np.float32) for w in range(n)]
bad = host[r].copy()
if r == 1:
    bad[300] = np.nan
out = cuda.device_array(1100, np.float32)
c.push_pull_async("ef", cuda.to_device(bad), out, n, 0, spec).result(60)
landed = out.copy_to_host()  # partition 1 (elements 256 to 511) skipped, the others averaged
assert np.isnan(landed[256:512]).all() and np.isfinite(np.delete(landed, range(256, 512))).all(), landed
c.push_pull_async("ef", cuda.to_device(host[r]), out, n, 0, spec).result(60)
want = first_round(params, host, n, 256)  # 1024-byte partitions
got = out.copy_to_host()
assert got[256:512].tobytes() == want[256:512].tobytes(), "the round after the skipped one is not a first round's"
print(f"OK {r}", flush=True)
c.finish()
"""


@pytest.mark.parametrize("shm", ["1", "0"])
def test_uncompressed_device_arrays_move_by_copies_and_land_divided_on_the_device(cluster, shm):
    c = cluster(workers=2, servers=2, env={"NUMBA_ENABLE_CUDASIM": "1", "GRADPRESS_SHM": shm,
                                           "BYTEPS_PARTITION_BYTES": "1024"})
    c.start(SCRIPT).assert_success(120)
    for w in range(2):
        assert "OK" in c.log(f"worker {w}"), c.log(f"worker {w}")


LOCAL = JOB_PREAMBLE + """
import os, numpy as np
from numba import cuda
from first_round import first_round
from gradpress.compressors.spec import CodecSpec
from gradpress.config import Settings
from gradpress.worker import WorkerClient
c = WorkerClient(Settings.load(os.environ))
c.start()
r, n = c.rank, c.size
assert c.comm.group is not None and c.comm.group.active, "the machine's workers must reduce locally"
host = [np.random.default_rng(w).standard_normal(3000).astype(np.float32) for w in range(n)]
machines = [host[0] + host[1], host[2] + host[3]]   # each machine's sum, local rank 0 first
out = cuda.device_array(3000, np.float32)
c.push_pull_async("raw", cuda.to_device(host[r]), out, n, 0).result(60)
want = np.empty(3000, np.float32)
np.divide(machines[0] + machines[1], n, out=want)
assert out.copy_to_host().tobytes() == want.tobytes(), "raw: not the two-level sum"
spec = CodecSpec.from_params({"compressor": "onebit", "scaling": True}, "test")
c.push_pull_async("signs", cuda.to_device(host[r]), out, n, 0, spec).result(60)
from gradpress.compressors import warmup
assert spec in warmup._ready_on_gpu, "the codec's kernels were not readied by the handing thread"
got = out.copy_to_host()
# each 4096-byte partition: owners encode their machine's sum, the server sums and re-encodes
want = first_round({"compressor": "onebit", "scaling": True}, machines, n, 1024)
assert got.tobytes() == want.tobytes(), "onebit: not the replay of owners, server and decode"
print(f"OK {r} {got[:2].tobytes().hex()}", flush=True)
c.finish()
"""


def test_device_arrays_through_local_reduction(cluster):
    c = cluster(workers=2, servers=1, env={"NUMBA_ENABLE_CUDASIM": "1", "BYTEPS_PARTITION_BYTES": "4096",
                                           "BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start_machines(LOCAL, local_size=2).assert_success(120)
    lines = [next(line for line in c.log(f"worker {w}").splitlines() if "OK" in line) for w in range(4)]
    assert len({line.split()[-1] for line in lines}) == 1, f"the workers landed different bits: {lines}"
