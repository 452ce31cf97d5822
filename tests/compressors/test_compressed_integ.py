"""Two-way compressed push/pull through real processes, against a numpy replay of the path.

The replay does, per partition key and step: worker momentum + error feedback +
compress (numpy reference codecs) for each worker; server decompress, sum, error
feedback, compress; worker decompress and average; a plain SGD step. The system's
parameters must match it to float32 rounding, and every worker must receive the
same bytes.
"""
import json

import numpy as np
import pytest
import torch

from gradpress.compressors import reference as ref
from gradpress.compressors.dithering import code_width
from gradpress.compressors.params import keep_count
from gradpress.compressors.policy import CompressionPolicy
from gradpress.placement import make_key

pytestmark = pytest.mark.integ
STEPS = 4
CASES = [
    {"name": "onebit", "params": {"compressor": "onebit", "ef": "vanilla", "scaling": True}},
    {"name": "onebit_nag", "params": {"compressor": "onebit", "ef": "vanilla", "scaling": True,
                                      "momentum": "nesterov", "mu": 0.9}},
    {"name": "topk", "params": {"compressor": "topk", "k": 0.1, "ef": "vanilla"}},
    {"name": "randomk", "params": {"compressor": "randomk", "k": 0.1, "ef": "corrected", "seed": 3},
     "lr_decay": True},
    {"name": "dithering", "params": {"compressor": "dithering", "s": 7, "partition": "natural",
                                     "normalize": "max", "ef": "vanilla", "seed": 1}},
    # mixed: the weight compressed, the bias exempted by a rule
    {"name": "mixed", "params": {"compressor": "onebit", "ef": "vanilla", "scaling": True},
     "rules": [["mixed.bias", {"compressor": "none"}]]},
]

WORKER = """
import json, os, torch, gradpress.torch as bps
from gradpress.torch import ops
cases, steps = json.loads(os.environ["GP_CASES"]), int(os.environ["GP_STEPS"])
bps.init()
r = bps.rank()
models, opts = {}, {}
for case in cases:
    torch.manual_seed(0)
    m = torch.nn.Linear(40, 30)
    named = [(f"{case['name']}.{n}", p) for n, p in m.named_parameters()]
    opts[case["name"]] = bps.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=named, compression_params=case["params"],
        compression_rules=[tuple(x) for x in case.get("rules", [])])
    models[case["name"]] = m
grads = {c["name"]: [] for c in cases}
for step in range(steps):
    g = torch.Generator().manual_seed(1000 * step + r)
    x, y = torch.randn(16, 40, generator=g), torch.randn(16, 30, generator=g)
    for case in cases:
        m, opt = models[case["name"]], opts[case["name"]]
        for group in opt.param_groups:
            group["lr"] = 0.1 / (1 + step) if case.get("lr_decay") else 0.1
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        grads[case["name"]].append({n: p.grad.clone() for n, p in m.named_parameters()})
client = ops._require()
keys = {n: [t.tensor_id, t.parts] for n, t in client.tensors.items()}
torch.save({"params": {k: m.state_dict() for k, m in models.items()}, "grads": grads, "keys": keys,
            "bytes_pushed": client.bytes_pushed}, os.path.join(os.environ["GP_TEST_DIR"], f"w{r}.pt"))
bps.shutdown()
"""


class Codec:
    """The numpy reference of one codec: compress to buffers, decompress to float32."""

    def __init__(self, params: dict):
        self.p = params
        self.kind = params["compressor"]

    def compress(self, x: np.ndarray, key: int, rnd: int) -> list:
        n = x.shape[0]
        if self.kind == "onebit":
            return ref.onebit(x, "l1")
        if self.kind == "topk":
            return ref.topk(x, keep_count(self.p["k"], n))
        if self.kind == "randomk":
            return ref.randomk(x, keep_count(self.p["k"], n), self.p["seed"], key, rnd, False)
        return ref.dithering(x, self.p["s"], True, "max", code_width(self.p["s"]), self.p["seed"], key, rnd)

    def decompress(self, bufs: list, n: int, key: int, rnd: int) -> np.ndarray:
        if self.kind == "onebit":
            return ref.onebit_decode(bufs, n)
        if self.kind == "topk":
            return ref.pairs_decode(bufs[0], bufs[1], n)
        if self.kind == "randomk":
            k = keep_count(self.p["k"], n)
            return ref.pairs_decode(ref.random_indices(n, k, self.p["seed"], key, rnd), bufs[0], n)
        return ref.dithering_decode(bufs, self.p["s"], True, code_width(self.p["s"]), n)


def f32(a, alpha, b):
    """``a + alpha * b`` as the kernels compute it: in float64, rounded to float32."""
    return (a.astype(np.float64) + alpha * b.astype(np.float64)).astype(np.float32)


def replay(case: dict, keys: dict, workers: int) -> dict:
    """The whole two-way path in numpy for one model; returns its final state_dict."""
    torch.manual_seed(0)
    model = torch.nn.Linear(40, 30)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    policy = CompressionPolicy(case["params"], [tuple(x) for x in case.get("rules", [])])
    worker_e, worker_m, server_e, last_lr = {}, {}, {}, {}
    for step in range(STEPS):
        lr = 0.1 / (1 + step) if case.get("lr_decay") else 0.1
        grads = []
        for r in range(workers):
            g = torch.Generator().manual_seed(1000 * step + r)
            x, y = torch.randn(16, 40, generator=g), torch.randn(16, 30, generator=g)
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append({n: p.grad.detach().numpy().ravel().copy() for n, p in model.named_parameters()})
        for pname, param in model.named_parameters():
            name = f"{case['name']}.{pname}"
            spec = policy.for_tensor(name, param.numel() * 4, "float32")
            params = None if spec is None else spec.compression_params
            if params is None:
                total = grads[0][pname].copy()
                for r in range(1, workers):
                    total += grads[r][pname]
                param.grad = torch.from_numpy(total / np.float32(workers)).view_as(param)
                continue
            codec, out = Codec(params), np.empty(param.numel(), np.float32)
            tensor_id, parts = keys["Gradient." + name]
            lo = 0
            for i, n in enumerate(parts):
                key = make_key(tensor_id, i)
                lam = last_lr.get(key, lr) / lr if params["ef"] == "corrected" else 1.0
                acc = None
                for r in range(workers):
                    g = grads[r][pname][lo:lo + n]
                    if params.get("momentum"):
                        m = worker_m.get((r, key))
                        m = g.copy() if m is None else f32(g, params["mu"], m)
                        worker_m[(r, key)] = m
                        g = f32(g, params["mu"], m)
                    e = worker_e.get((r, key))
                    p = g if e is None else f32(g, lam, e)
                    d = codec.decompress(codec.compress(p, key, step), n, key, step)
                    worker_e[(r, key)] = p - d
                    acc = d.copy() if acc is None else acc + d
                e = server_e.get(key)
                s = acc if e is None else f32(acc, lam, e)
                d = codec.decompress(codec.compress(s, key, step), n, key, step)
                server_e[key] = s - d
                last_lr[key] = lr
                out[lo:lo + n] = d / np.float32(workers)
                lo += n
            param.grad = torch.from_numpy(out).view_as(param)
        for group in sgd.param_groups:
            group["lr"] = lr
        sgd.step()
    return model.state_dict()


@pytest.mark.parametrize("workers,servers", [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_system_matches_numpy_replay_of_the_two_way_path(cluster, workers, servers):
    c = cluster(workers=workers, servers=servers,
                env={"BYTEPS_PARTITION_BYTES": "2048", "BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start(WORKER, worker_env={"GP_CASES": json.dumps(CASES), "GP_STEPS": str(STEPS)}).assert_success()
    got = [torch.load(c.tmp / f"w{r}.pt") for r in range(workers)]
    keys = got[0]["keys"]
    assert len(keys["Gradient.onebit.weight"][1]) == 3, "the weight should span 3 partitions"
    for case in CASES:
        name = case["name"]
        for r in range(1, workers):  # every worker received the same bytes every step
            for step in range(STEPS):
                for pname, g in got[0]["grads"][name][step].items():
                    assert torch.equal(got[r]["grads"][name][step][pname], g), \
                        f"{name}.{pname}: worker {r} pulled a different aggregate at step {step}"
        want = replay(case, keys, workers)
        for pname, v in want.items():
            torch.testing.assert_close(got[0]["params"][name][pname], v, rtol=2e-6, atol=2e-7,
                                       msg=lambda m: f"{name}.{pname} ({workers} workers, {servers} servers): {m}")
    # compression shows on the wire: the mixed model's weight pushes far fewer bytes than raw
    assert got[0]["bytes_pushed"] < len(CASES) * STEPS * (1200 + 30) * 4 / 4


BAD = """
import math, torch, gradpress.torch as bps
from gradpress.errors import JobError, OpTimeoutError, TensorMismatchError
bps.init()
r = bps.rank()
try:  # workers disagreeing on compression get an error naming the tensor
    bps.push_pull(torch.ones(100), name="t",
                  compression_params={"compressor": "topk", "k": 0.5} if r == 0 else {"compressor": "onebit"})
    raise SystemExit("no error for different compression")
except TensorMismatchError as e:
    assert "'t'" in str(e) and "topk" in str(e) and "onebit" in str(e), e
try:
    bps.push_pull(torch.ones(10), name="u", compression_params={"compressor": "zip"})
    raise SystemExit("no error for an unknown compressor")
except ValueError as e:
    assert "zip" in str(e) and "onebit" in str(e), e
x = torch.ones(100)
if r == 0:
    x[3] = math.nan
# worker 0 cannot compress NaN: its round goes out nonfinite, and is skipped on both workers
# at once (NaN, as an uncompressed sum with a NaN would be); the next round is whole
nan = dict(name="nan", compression_params={"compressor": "onebit", "ef": "vanilla", "scaling": True})
try:
    got = bps.push_pull(x, **nan)
except OpTimeoutError as e:
    raise SystemExit(f"worker {r} waited for a round that worker 0 skipped: {e}")
assert torch.isnan(got).all(), got
again = bps.push_pull(torch.full((100,), 2.0), **nan)
assert torch.equal(again, torch.full((100,), 2.0)), again
print(f"OK {r}", flush=True)
bps.shutdown()
"""


def test_bad_compression_is_a_clear_error(cluster):
    c = cluster(workers=2, servers=1, env={"GRADPRESS_OP_TIMEOUT_S": "3"})
    c.start(BAD).assert_success(60)
    assert "OK 0" in c.log("worker 0") and "OK 1" in c.log("worker 1")


JOB_FILE_WORKER = """
import sys, torch, gradpress.torch as bps
from gradpress.torch import ops
sys.path.insert(0, "examples")
from train_digits import DigitsCNN
bps.init()
model = DigitsCNN()
opt = bps.DistributedOptimizer(torch.optim.Adam(model.parameters()), named_parameters=model.named_parameters())
model(torch.randn(4, 1, 8, 8)).sum().backward()
opt.step()
codecs = {name: t.spec for name, t in ops.client().tensors.items()}
assert codecs["Gradient.fc1.weight"].codec == "onebit", codecs
# below BYTEPS_MIN_COMPRESS_BYTES: uncompressed, fused with the other biases (GRADPRESS_FUSE_BELOW_BYTES)
fused = opt._gradpress._route[id(model.fc1.bias)]
assert fused.kind == "bucket" and codecs[fused.name] is None and "Gradient.fc1.bias" not in codecs, codecs
assert codecs["Gradient.conv2.weight"] is None, codecs  # the default: none
print("OK job file", flush=True)
bps.shutdown()
"""


def test_the_job_files_compression_table_applies_to_the_optimizer(cluster):
    from pathlib import Path
    demo = Path(__file__).parents[2] / "configs" / "demo.toml"
    c = cluster(workers=2, servers=1, env={"GRADPRESS_CONFIG": str(demo), "BYTEPS_LOG_LEVEL": "WARNING"})
    c.start(JOB_FILE_WORKER).assert_success()
    assert "OK job file" in c.log("worker 0")
