"""A CUDA tensor's partitions compressed together (``GRADPRESS_GROUP_PARTITIONS``), through a
real job under Numba's CUDA simulator: 2 workers, 2 servers, a 3,000-element tensor in
partitions of 1,024, onebit with error feedback on the workers and the servers, then fp16
with corrected error feedback (the learning rate changing every step), then random-k (whose
draws depend on each key's round). Every
round's average must be the replay's bits, key by key with the CPU compressors (each
worker's partitions, the servers' sums and re-encoding, the decode), and the worker's
residuals must live in one device array per tensor (the launches were shared), and every
encoder must have run on the host-copies thread, never on the communication thread, which
goes on landing and sending while an encoder's payload copies back. The setting off is
test_together.py's."""
import pytest
from simulated import JOB_PREAMBLE

pytestmark = pytest.mark.integ

SCRIPT = JOB_PREAMBLE + """
import os, numpy as np
from numba import cuda
from gradpress.compressors import build_compressor
from gradpress.compressors.spec import CodecSpec
from gradpress.config import Settings
from gradpress.worker import WorkerClient
import threading
from gradpress.compressors.error_feedback import ErrorFeedback
encoded_on = set()
together = ErrorFeedback.compress_partitions
def compress_partitions(self, *args, **kwargs):
    encoded_on.add(threading.current_thread().name)
    return together(self, *args, **kwargs)
ErrorFeedback.compress_partitions = compress_partitions
c = WorkerClient(Settings.load(os.environ))
c.start()
r, n = c.rank, c.size
N, PART = 3000, 1024
bounds = [(s, min(s + PART, N)) for s in range(0, N, PART)]
out = cuda.device_array(N, np.float32)
wholes = []
for name, params in (("signs", {"compressor": "onebit", "scaling": True, "ef": "vanilla"}),
                     ("halves", {"compressor": "fp16", "ef": "corrected"}),
                     ("picks", {"compressor": "randomk", "k": 0.1, "seed": 5, "ef": "vanilla"})):
    spec = CodecSpec.from_params(params, "test")
    workers = [[build_compressor(params, "worker") for _ in bounds] for _ in range(n)]
    servers = [build_compressor(params, "server") for _ in bounds]
    for step in range(2):  # the first step (p = g), then the residuals in place
        host = [np.random.default_rng(10 * w + step).standard_normal(N).astype(np.float32) for w in range(n)]
        lr = 0.1 / (step + 1)
        c.push_pull_async(name, cuda.to_device(host[r]), out, n, 0, spec, lr=lr).result(60)
        keys = [wk.key for wk in c.comm.table.tensors[name].keys]  # random-k draws by key and round
        want = np.empty(N, np.float32)
        for p, ((a, b), key) in enumerate(zip(bounds, keys)):
            acc = np.zeros(b - a, np.float32)
            for w in range(n):
                header, payload = workers[w][p].compress(host[w][a:b], key=key, round=step, lr=lr)
                servers[p].decompress_add(header, payload, acc, key=key, round=step)
            header, payload = servers[p].compress(acc, key=key, round=step, lr=lr)
            workers[0][p].decompress(header, payload, want[a:b], key=key, round=step, divisor=n)
        got = out.copy_to_host()
        assert got.tobytes() == want.tobytes(), (name, step, np.flatnonzero(got != want)[:5])
    wholes.append(len(c.comm.table.tensors[name].compressor._wholes))
assert "gp-host-copies" in encoded_on and "gp-worker-comm" not in encoded_on, encoded_on  # (main: the warm-up)
print(f"OK {r} wholes={wholes}", flush=True)
c.finish()
"""


def test_a_tensors_partitions_compressed_together_give_the_replays_bits(cluster):
    c = cluster(workers=2, servers=2, env={"NUMBA_ENABLE_CUDASIM": "1", "BYTEPS_PARTITION_BYTES": "4096",
                                           "BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start(SCRIPT).assert_success(180)
    for w in range(2):
        line = next(x for x in c.log(f"worker {w}").splitlines() if "OK" in x)
        assert "wholes=[1, 1, 1]" in line, line
