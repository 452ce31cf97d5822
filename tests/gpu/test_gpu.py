"""The CUDA path on a real GPU (``make gpu-check``; skipped where torch sees no GPU): every
codec's CUDA encoder byte-identical to the CPU kernels at sizes past a partition; a
gradient produced on a side stream pushed as produced, not as stale memory, alone or fused
with gradients of another stream; float16 and bfloat16 CUDA gradients through every codec;
a worker on a device other than 0; a short CUDA training job whose workers end identical;
and OneBitAdam and ZeroOneAdam on CUDA parameters, their multi-tensor arithmetic against one
tensor at a time."""
import json

import numpy as np
import pytest
import torch

from adam_jobs import SCALE
import amp_jobs
from cluster import LocalCluster
from compressors.cases import CODEC_PARAMS, gaussian

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch")]
SIZES = [1, 9, 300, 65537, 4_194_307]   # the raw fallback, partial bytes and blocks, past a 4 MB partition
KEY, ROUND = 77, 5


def payload_bytes(payload):
    header, buffers = payload
    return header, [bytes(memoryview(np.asarray(b)).cast("B")) for b in buffers]


@pytest.mark.parametrize("name,params", CODEC_PARAMS, ids=[n for n, _ in CODEC_PARAMS])
def test_cuda_encoders_match_the_cpu_kernels_byte_for_byte(name, params):
    from gradpress.compressors import build_compressor
    codec = build_compressor(params, "server")
    for n in SIZES:
        x = gaussian(n, seed=n)
        want = payload_bytes(codec.compress(x, key=KEY, round=ROUND))
        got = payload_bytes(codec.compress(torch.from_numpy(x).cuda(), key=KEY, round=ROUND))
        assert got == want, f"{name}, n={n}: the CUDA payload differs from the CPU one"


def test_error_feedback_on_the_gpu_leaves_the_cpu_residuals():
    from gradpress.compressors import build_compressor
    for params in ({"compressor": "onebit", "scaling": True, "ef": "vanilla"},
                   {"compressor": "topk", "k": 0.01, "ef": "vanilla"},
                   {"compressor": "randomk", "k": 0.01, "seed": 3, "ef": "vanilla"}):
        host, device = build_compressor(params, "worker"), build_compressor(params, "worker")
        for round_ in range(3):
            g = gaussian(1 << 20, seed=round_)
            want = payload_bytes(host.compress(g, key=1, round=round_))
            got = payload_bytes(device.compress(torch.from_numpy(g).cuda(), key=1, round=round_))
            assert got == want, f"{params}, round {round_}: payloads differ"


def test_random_k_draws_on_the_device_are_floyds_at_scale():
    """randomk's index sets drawn on the GPU against Floyd's on the host: 64M elements at 1%
    (the encoder benchmark's size), 1M at 90% (long collision chains), and a tensor's
    partitions at once."""
    from gradpress.kernels.cpu.randomk import random_indices
    from gradpress.kernels.cuda import randomk_draws
    from gradpress.kernels.rng import stream_id
    for n, k in ((1 << 26, 671_089), (1 << 20, 943_719)):
        stream = stream_id(3, n, k)
        got = randomk_draws.draw(n, k, n, k, [stream], "test-draws").copy_to_host()
        assert got.tobytes() == random_indices(n, k, stream).tobytes(), f"n={n}, k={k}"
    part, last, streams = 1_024_000, 77, [stream_id(3, key, 5) for key in range(5)]
    got = randomk_draws.draw(part, 10_240, last, 1, streams, "test-draws").copy_to_host()
    want = np.concatenate([random_indices(part, 10_240, s) + np.uint32(i * part) for i, s in enumerate(streams[:-1])]
                          + [random_indices(last, 1, streams[-1]) + np.uint32(4 * part)])
    assert got.tobytes() == want.astype(np.uint32).tobytes()

def test_a_tensors_partitions_compressed_together_match_key_by_key():
    """Against the same compressor key by key on the GPU, and against the CPU: corrected
    error feedback's p = g + lam * e with lam = 0.1 / 0.07 and 0.07 / 0.03, not float32
    values, rounded where the CPU rounds it (``kernels/cuda/compensation``)."""
    from gradpress.compressors import build_compressor
    part, keys = 1_024_000, [10, 11, 12, 13, 14]   # BytePS's 4,096,000-byte partitions, the last of 77
    for params in ({"compressor": "onebit", "scaling": True, "ef": "corrected"},
                   {"compressor": "onebit", "scaling": True, "ef": "vanilla"},
                   {"compressor": "fp16", "ef": "vanilla"},
                   {"compressor": "randomk", "k": 0.01, "seed": 3, "ef": "vanilla"},
                   {"compressor": "dithering", "s": 7, "seed": 3, "ef": "vanilla"},
                   {"compressor": "dithering", "s": 1, "normalize": "l2", "ef": "corrected"},
                   {"compressor": "topk", "k": 0.01, "ef": "vanilla"},
                   {"compressor": "topk", "k": 0.3, "ef": "corrected"}):
        together, apart, host = (build_compressor(params, "worker") for _ in range(3))
        for round_ in range(3):
            g = gaussian(4 * part + 77, seed=round_)
            x, lr = torch.from_numpy(g).cuda(), (0.1, 0.07, 0.03)[round_]
            got = together.compress_partitions(x, keys, part, lr, [round_] * len(keys))
            assert got is not None, f"{params}: declined"
            for i, (key, payload) in enumerate(zip(keys, got)):
                chunk = slice(i * part, (i + 1) * part)
                want = payload_bytes(apart.compress(x[chunk], key=key, round=round_, lr=lr))
                assert payload_bytes(payload) == want, f"{params}, round {round_}, key {key}: payloads differ"
                residual = together.residual(key).copy_to_host()
                assert residual.tobytes() == apart.residual(key).copy_to_host().tobytes(), \
                    f"{params}, round {round_}, key {key}: residuals differ"
                cpu = payload_bytes(host.compress(g[chunk], key=key, round=round_, lr=lr))
                assert cpu == want and residual.tobytes() == host.residual(key).tobytes(), \
                    f"{params}, round {round_}, key {key}: the GPU differs from the CPU"


SIDE_STREAM = """
import os, torch, gradpress.torch as bps
bps.init()
n = 1 << 22
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    g = torch.zeros(n, device="cuda")
    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):  # keeps the side stream busy: stale memory would be zeros
        a = torch.tanh(a @ a)
    g.copy_(torch.full((n,), 3.0, device="cuda") + a.sum() * 0)
    raw = g.clone()  # uncompressed: the DMA path (device to shared memory, back, divided on the device)
    handle = bps.push_pull_async_inplace(g, average=True, name="g", compression_params={"compressor": "fp16"})
    raw_handle = bps.push_pull_async_inplace(raw, average=True, name="raw")
    out, raw_out = bps.synchronize(handle), bps.synchronize(raw_handle)
    ok = bool((out == 3.0).all()) and bool((raw_out == 3.0).all())  # read on s: after the output's event
torch.cuda.synchronize()
assert ok, "the push_pull read the gradient before the side stream had written it"
bps.shutdown()
"""


FUSED_ON_TWO_STREAMS = """
import torch, gradpress.torch as bps
bps.init()
a, b = torch.nn.Linear(64, 64).cuda(), torch.nn.Linear(64, 64).cuda()
named = list(a.named_parameters(prefix="a")) + list(b.named_parameters(prefix="b"))
opt = bps.DistributedOptimizer(torch.optim.SGD([p for _, p in named], lr=0.0), named_parameters=named)
s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
x = torch.ones(8, 64, device="cuda")
torch.cuda.synchronize()
for busy in (s1, s2):  # each branch's gradients made late in turn: one of them is not the last hook's stream
    with torch.cuda.stream(busy):
        w = torch.randn(4096, 4096, device="cuda")
        for _ in range(20):
            w = torch.tanh(w @ w)
    with torch.cuda.stream(s1):
        ya = a(x + (w.sum() * 0 if busy is s1 else 0))
    with torch.cuda.stream(s2):
        yb = b(x + (w.sum() * 0 if busy is s2 else 0))
    # (the loss reads ya and yb unordered, on purpose: its value is not used, and a wait for
    # the branches here would hold the backward pass until both had run)
    ((ya.sum() + yb.sum()) * (bps.rank() + 1)).backward()  # each bias's gradient: 8 (rank + 1)
    opt.synchronize()
    torch.cuda.synchronize()
    for p in (a.bias, b.bias):  # the two biases travel fused (small 1-D gradients), made on two streams
        assert bool((p.grad == 12.0).all()), (busy is s1, p.grad[:4].tolist())
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()
bps.shutdown()
"""


def _job(tmp_path, script: str) -> None:
    """``script`` on 2 workers and 1 server, every process ending well."""
    c = LocalCluster(tmp_path, workers=2, servers=1)
    try:
        c.start(script).assert_success(180)
    finally:
        c.kill()


@pytest.mark.integ
def test_a_gradient_made_on_a_side_stream_is_pushed_as_made(tmp_path):
    _job(tmp_path, SIDE_STREAM)


@pytest.mark.integ
def test_gradients_fused_from_two_streams_are_pushed_as_made(tmp_path):
    _job(tmp_path, FUSED_ON_TWO_STREAMS)


@pytest.mark.integ
@pytest.mark.timeout(300)
def test_loss_scaling_on_cuda_skips_an_overflow_alike_with_codecs_and_compressed_adams(tmp_path):
    """The host's loss-scaling jobs (tests/torch/test_amp_integ.py, tests/optim/
    test_amp_adam_integ.py) on CUDA workers with ``GradScaler("cuda")``: an overflow on one
    worker skips the round alike (the CUDA encoders refuse the inf, NaN lands on the device,
    the key's state restarts) and OneBitAdam/ZeroOneAdam skip their step alike."""
    # (uncompressed, the scaler alone finds the inf: the host's test covers it, and the GPU
    # check's minutes are few)
    for codec in ("onebit", "adam"):
        (tmp_path / codec).mkdir()
    c = LocalCluster(tmp_path / "onebit", workers=2, servers=1, env={"BYTEPS_MIN_COMPRESS_BYTES": "0"})
    try:
        c.start(amp_jobs.AMP, worker_env={"GP_CODEC": "onebit", "GP_DEVICE": "cuda"}).assert_success(120)
        amp_jobs.check(*(torch.load(c.tmp / f"amp{r}.pt") for r in range(2)))
    finally:
        c.kill()
    c = LocalCluster(tmp_path / "adam", workers=2, servers=1, env={"BYTEPS_MIN_COMPRESS_BYTES": "0"})
    try:
        c.start(amp_jobs.ADAM, worker_env={"GP_DEVICE": "cuda"}).assert_success(150)
        amp_jobs.check_adam([torch.load(c.tmp / f"w{r}.pt") for r in range(2)])
    finally:
        c.kill()


ROWS = """
import torch, gradpress.torch as bps
from gradpress.torch import ops
bps.init()
results = {}
s = torch.cuda.Stream()
for dtype in (torch.float16, torch.bfloat16, torch.float32):
    with torch.cuda.stream(s):  # made on a side stream: the rows are found after it wrote them
        a = torch.randn(2048, 2048, device="cuda")
        for _ in range(10):
            a = torch.tanh(a @ a)
        m = torch.zeros(1000, 8, device="cuda", dtype=dtype)
        rows = torch.arange(16, device="cuda", dtype=torch.float32).view(2, 8) + 1 + a.sum() * 0
        m[[3, 500 + bps.rank()]] = rows.to(dtype)
        out = bps.synchronize(ops.push_pull_rows_async_inplace(m, average=True, name=f"rows.{dtype}"))
        results[str(dtype)] = out.float().cpu()
torch.cuda.synchronize()
want = torch.zeros(1000, 8)
rows = torch.arange(16, dtype=torch.float32).view(2, 8) + 1
want[3] = rows[0]
want[500] += rows[1] / 2
want[501] += rows[1] / 2
for dtype, got in results.items():
    assert torch.equal(got, want), f"{dtype}: the rows' average differs"
bps.shutdown()
"""


@pytest.mark.integ
def test_rows_of_a_cuda_float16_bfloat16_float32_tensor_are_found_on_the_device(tmp_path):
    _job(tmp_path, ROWS)


# Three checks of the API on CUDA tensors, in one job (each job's processes take seconds to
# start on the GPU machine: make gpu-check has 6 minutes).
ON_DEVICE = """
import torch, gradpress.torch as bps
from gradpress.torch.parallel import DistributedDataParallel
bps.init()
r, n = bps.rank(), bps.size()

# 1. a dense CUDA gradient that is mostly zero rows: the density vote, counted on the device,
# moves it to the rows route after its first step; every step's average exact
emb = torch.nn.Embedding(1000, 16).cuda()
start = emb.weight.detach().clone()
opt = bps.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5), named_parameters=emb.named_parameters())
touched = torch.tensor([[3, 7, 7], [3, 500, 900]], device="cuda")   # by rank; a row twice
for step in range(3):
    opt.zero_grad()
    emb(touched[r]).sum().backward()   # dense gradient: 3 rows of 1000 non-zero
    opt.step()
route = opt._gradpress._route[id(emb.weight)]
assert route.kind == "rows", f"the vote left the mostly-zero embedding on route {route.kind!r}"
counts = torch.zeros(1000, device="cuda")
for w in range(2):
    counts.index_add_(0, touched[w], torch.ones(3, device="cuda"))
want = start
for step in range(3):   # SGD's update of the exact average (quarters and halves)
    want = want.add((counts / 2)[:, None].expand(-1, 16), alpha=-0.5)
assert torch.equal(emb.weight.detach(), want), "the embedding's averaged steps differ"

# 2. CUDA int64 summed and averaged exactly (float64 halves made on the device)
wrap = lambda v: (v + 2**63) % 2**64 - 2**63
big = torch.tensor([2**53 + 1 + r, -(2**61), -3 - r], dtype=torch.int64, device="cuda")
sums = [n * (2**53 + 1) + n * (n - 1) // 2, -n * 2**61, -3 * n - n * (n - 1) // 2]
got = bps.push_pull(big, average=False, name="int64")
assert got.is_cuda and got.tolist() == [wrap(v) for v in sums], got
got = bps.push_pull(big, average=True, name="int64")   # floor division, as BytePS's
assert got.is_cuda and got.tolist() == [v // n for v in sums], got
# BatchNorm's buffers (num_batches_tracked is int64) from rank 0 at every forward, on the device
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8)).cuda()
ddp = DistributedDataParallel(model)
for step in range(3):
    model[1].num_batches_tracked.fill_(10 * step + r)
    ddp(torch.randn(4, 8, device="cuda")).sum().backward()
    assert model[1].num_batches_tracked.item() == 10 * step + 1, model[1].num_batches_tracked

# 3. a capturable Adam's CUDA learning rate, broadcast onto each worker's GPU
model = torch.nn.Linear(16, 4).cuda()
adam = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01 * (r + 1), device="cuda"), capturable=True)
model(torch.randn(8, 16, device="cuda")).sum().backward()
adam.step()   # state on the device ('step' too: capturable)
bps.broadcast_optimizer_state(adam, root_rank=0)
lr = adam.param_groups[0]["lr"]
assert lr.is_cuda and torch.equal(lr.cpu(), torch.tensor(0.01)), lr   # on this worker's GPU, as on the root
adam.step()   # and steps with it and the broadcast state (on the device: capturable)
assert all(st["step"].is_cuda for st in adam.state.values())
bps.shutdown()
"""


@pytest.mark.integ
def test_a_voted_row_sparse_gradient_int64_sums_and_a_cuda_learning_rate_on_the_device(tmp_path):
    _job(tmp_path, ON_DEVICE)


TRAIN = """
import json, os, threading, torch, gradpress.torch as bps
from numba.cuda.dispatcher import CUDADispatcher
on_comm_thread, compile = [], CUDADispatcher.compile

def recorded(self, sig):  # compiled on the communication or host-copies thread: every push waits meanwhile
    before = len(self.overloads)
    kernel = compile(self, sig)
    if len(self.overloads) > before and getattr(threading.current_thread(), "owns_gpu_work", False):
        on_comm_thread.append(self.py_func.__name__)
    return kernel
CUDADispatcher.compile = recorded
bps.init()
device = torch.device(os.environ.get("GP_DEVICE", "cuda:0"))
results = {}
for label, params in json.loads(os.environ["GP_RUNS"]).items():
    for dtype in json.loads(os.environ["GP_DTYPES"]):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
        model = model.to(device, getattr(torch, dtype))
        named = [(f"{label}.{dtype}.{n}", p) for n, p in model.named_parameters()]
        extra = {"compression_params": params} if params else {}
        opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=named, **extra)
        g = torch.Generator(device=device).manual_seed(bps.rank())
        for step in range(int(os.environ.get("GP_STEPS", "6"))):
            x = torch.randn(32, 256, device=device, generator=g).to(getattr(torch, dtype))
            opt.zero_grad()
            model(x).float().pow(2).mean().backward()
            opt.step()
        results[f"{label}/{dtype}"] = {n: p.detach().float().cpu() for n, p in model.named_parameters()}
torch.save(results, os.path.join(os.environ["GP_TEST_DIR"], f"w{bps.rank()}.pt"))
assert not on_comm_thread, f"kernels compiled on the worker's GPU threads (communication, copies): {on_comm_thread}"
bps.shutdown()
"""
CODECS = {"none": None, "fp16": {"compressor": "fp16"},
          "onebit": {"compressor": "onebit", "scaling": True, "ef": "vanilla"},
          "topk": {"compressor": "topk", "k": 0.01, "ef": "vanilla"},
          "randomk": {"compressor": "randomk", "k": 0.01, "seed": 1, "ef": "vanilla"},
          "dithering": {"compressor": "dithering", "s": 7},
          "acpsgd": {"compressor": "acpsgd", "rank": 2}, "auto": {"compressor": "auto"},
          # every group as float16 on the wire once planned (Compression.fp16's way, on the plan's buckets)
          "auto_fp16_raw": {"compressor": "auto", "allowed": ["fp16_raw"]}}


def _train(tmp_path, runs, dtypes, env=None):
    c = LocalCluster(tmp_path, workers=2, servers=2,
                     env={"BYTEPS_MIN_COMPRESS_BYTES": "0", "GRADPRESS_PLAN_STEPS": "2", **(env or {})})
    try:
        c.start(TRAIN, worker_env={"GP_RUNS": json.dumps(runs), "GP_DTYPES": json.dumps(dtypes)}).assert_success(300)
    finally:
        c.kill()
    a, b = (torch.load(tmp_path / f"w{r}.pt") for r in range(2))
    for run, state in a.items():
        for name, value in state.items():
            assert torch.isfinite(value).all(), f"{run}: {name} is not finite"
            assert torch.equal(value, b[run][name]), f"{run}: the workers differ at {name}"
    return a


@pytest.mark.integ
@pytest.mark.timeout(330)  # (_train's job may take 300 s: pytest's default of 180 would cut it)
def test_cuda_training_with_every_codec_in_every_float_dtype(tmp_path):
    _train(tmp_path, CODECS, ["float32", "float16", "bfloat16"], {"GP_STEPS": "8"})


@pytest.mark.integ
@pytest.mark.timeout(330)
def test_training_with_partitions_compressed_together_is_the_key_by_key_training(tmp_path):
    runs = {"onebit": CODECS["onebit"], "fp16": {"compressor": "fp16", "ef": "vanilla"}, "randomk": CODECS["randomk"],
            "topk": CODECS["topk"], "dithering": {**CODECS["dithering"], "ef": "vanilla"}}
    small = {"BYTEPS_PARTITION_BYTES": "65536"}   # 2 partitions a weight
    for way in ("on", "off"):
        (tmp_path / way).mkdir()
    together = _train(tmp_path / "on", runs, ["float32"], {**small, "GRADPRESS_GROUP_PARTITIONS": "1"})
    apart = _train(tmp_path / "off", runs, ["float32"], {**small, "GRADPRESS_GROUP_PARTITIONS": "0"})
    for run in (f"{name}/float32" for name in runs):
        for name, value in together[run].items():
            assert torch.equal(value, apart[run][name]), f"{run}: {name}: together and apart differ"


@pytest.mark.integ
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="one GPU: no device other than 0")
def test_a_worker_on_a_device_other_than_0(tmp_path):
    _train(tmp_path, {"onebit": CODECS["onebit"], "none": None}, ["float32"], {"GP_DEVICE": "cuda:1"})


def test_the_planner_times_the_codecs_and_copies_on_the_gpu(tmp_path, monkeypatch):
    from gradpress.pipeline.planning.gpu_costs import measure_on_device
    from gradpress.planner import calibrate
    monkeypatch.setenv("GRADPRESS_CACHE_DIR", str(tmp_path))
    options = {"onebit": {"compressor": "onebit", "scaling": True, "ef": "vanilla"},
               "fp16_raw": {"compressor": "fp16_raw"}, "acpsgd": {"compressor": "acpsgd", "rank": 4}}
    dev = torch.device("cuda:0")
    costs = calibrate.codec_costs(options, lambda p: measure_on_device(p, dev), torch.cuda.get_device_name(dev))
    raw, onebit, halves = costs["none"], costs["onebit"], costs["fp16_raw"]
    # float16 on the wire: the cast and half the copies on the device, the float16 sums on the host
    assert halves.payload_ratio == 0.5 and halves.compress.per_byte_s > 0 and halves.decompress.per_byte_s > 0
    assert halves.server_compress is not None and halves.server_compress.per_byte_s > 0
    # the raw path's compress is the copy off the device: it costs something, per byte
    assert raw.compress.per_byte_s > 0 and raw.decompress.per_byte_s > 0
    assert onebit.server_compress is not None  # the servers recompress on the host, not at the card's cost
    assert 0 < onebit.payload_ratio < 0.05
    # the factor products and the reconstruction as torch ops on the card, one round of factors
    acp = costs["acpsgd"]
    # (the fitted slope of a product held in the card's L2 cache may be 0: what 4 MB costs is not)
    assert acp.rank == 4 and acp.rounds == 1 and acp.compress(4 << 20) > 0 and acp.decompress(4 << 20) > 0
    # cached per card: a second call reads the same numbers back without measuring
    assert calibrate.codec_costs(options, lambda p: 1 / 0, torch.cuda.get_device_name(dev)) == costs


ADAM = """
import json, os, torch, gradpress.torch as bps
from gradpress.optim import adam_math
each_tensor, chunks_of_lists = (lambda ts: [[t] for t in ts]), adam_math.chunks  # the latter before any run
SCALE_CLASS
bps.init()
device = torch.device(os.environ.get("GP_DEVICE", "cuda:0"))
results = {}
for opt_name in ("OneBitAdam", "ZeroOneAdam"):
    # a float16 model and a float32 parameter: the Adam state float32, float16 and float32 tensors in one
    # multi-tensor op
    for codec, params, dtype in (("none", {"compressor": "none"}, torch.float32), ("onebit", None, torch.float32),
                                 ("onebit-float16", None, torch.float16)):
        for way in ("lists", "each"):
            adam_math.chunks = each_tensor if way == "each" else chunks_of_lists
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
            model = model.to(device, dtype)
            if dtype == torch.float16:  # one float32 parameter amid them: a list per dtype
                model.insert(2, Scale(128).to(device))
            named = [(f"{opt_name}.{codec}.{way}.{n}", p) for n, p in model.named_parameters()]
            kw = dict(lr=0.01, weight_decay=0.01, named_parameters=named, compression_params=params)
            if opt_name == "OneBitAdam":
                opt = bps.OneBitAdam(model.parameters(), freeze_step=2, **kw)
            else:
                opt = bps.ZeroOneAdam(model.parameters(), var_freeze_step=3, var_update_scaler=1,
                                      local_step_scaler=1, local_step_clipper=2, **kw)
            g = torch.Generator(device=device).manual_seed(bps.rank())
            steps, losses = [], []
            for step in range(8):
                x = torch.randn(32, 64, device=device, generator=g).to(dtype)
                opt.zero_grad()
                loss = (model(x) - x[:, :8]).pow(2).mean()
                loss.backward()
                opt.step()
                losses.append(loss.item())
                assert all(torch.isfinite(p).all() for p in model.parameters()), (opt_name, codec, step)
                synced = getattr(opt, "in_sync", True)
                steps.append({n: p.detach().cpu() for n, p in model.named_parameters()} if synced else None)
            results[(opt_name, codec, way)] = {"steps": steps, "losses": losses}
torch.save(results, os.path.join(os.environ["GP_TEST_DIR"], f"w{bps.rank()}.pt"))
bps.shutdown()
""".replace("SCALE_CLASS", SCALE)


@pytest.mark.integ
@pytest.mark.timeout(330)
def test_onebit_and_zero_one_adam_on_cuda_parameters(tmp_path):
    """Their arithmetic on a GPU runs multi-tensor ops over whole lists: the workers end each
    synchronising step identical, and the lists land where one tensor at a time does (to
    float rounding: on a GPU a multi-tensor divide may round apart from the single op's)."""
    c = LocalCluster(tmp_path, workers=2, servers=1, env={"BYTEPS_MIN_COMPRESS_BYTES": "0"})
    try:
        c.start(ADAM).assert_success(300)
    finally:
        c.kill()
    a, b = (torch.load(tmp_path / f"w{r}.pt") for r in range(2))
    for run, got in a.items():
        synced = [i for i, s in enumerate(got["steps"]) if s is not None]
        assert len(synced) >= 5, f"{run}: synchronising steps {synced}"
        for i in synced:
            assert all(torch.equal(v, b[run]["steps"][i][n]) for n, v in got["steps"][i].items()), \
                f"{run}: the workers differ after step {i + 1}"
        assert got["losses"][-1] < got["losses"][0], f"{run}: the loss did not fall: {got['losses']}"
        if run[1] == "none" and run[2] == "lists":
            each = a[(run[0], "none", "each")]["steps"]
            for i in synced:
                for n, v in got["steps"][i].items():
                    torch.testing.assert_close(v, each[i][n], rtol=1e-5, atol=1e-6, msg=f"{run}: {n}, step {i + 1}")
