"""GPU workers, on a machine with a CUDA GPU (``make gpu-check`` runs ``--quick``).

    python benchmarks/gpu.py [--quick] [--parts encoders,jobs] [--iters N]

encoders: each codec's worker encoder (error feedback on, payload delivered to the host)
on 64M float32 on the GPU, in GB/s of input, beside what the card does in the same run:
its read bandwidth (``x.sum()``), a pinned device-to-host copy, and torch's own version of
each encoder (sign and bit-pack, ``torch.topk``, a gather at random indices, ``half()``,
each with its payload copied to pinned memory).

jobs: the transformer of ``bandwidth.py`` (33.6M parameters, 102 tensors) trained by two
workers (each on its own GPU where there are two, else both on GPU 0) and two servers on
this machine (``gradpress.launcher --local``) for every setting, against compute only
(both workers at once, no communication) and torch DDP over gloo (and NCCL with one GPU
per process), with and without PowerSGD. Median seconds per iteration, each synchronised,
after 12 warm-up iterations; ``auto`` is timed once every worker holds its settled plan.
Worker 0 also records its backward pass twice, the call's span on the host and the span
between CUDA events recorded around it on the training stream (``_backward_host_s``,
``_backward_device_s``), and each of its threads' CPU seconds a step (``_thread_cpu_s``):
a slow backward whose autograd thread burns little CPU is one whose hooks wait.

Settings run again with one worker setting changed (``VARIANTS``), named in ``--systems``:
``gp_none_gil200`` and ``gp_onebit_gil200`` with GRADPRESS_GIL_SWITCH_US=200,
``gp_none_apart`` with GRADPRESS_LOCAL_REDUCE=0 (each worker pushes its own gradients),
``gp_onebit_fused`` (also run by default) and ``gp_topk_fused`` with
GRADPRESS_FUSE_COMPRESSED_BYTES=33554432.

copies: a 64 MB partition's copies off and onto the device, for each kind of host memory the
worker uses (pageable, pinned, its own registered shared memory, a peer's registered).

launches: the compress stage of one step of that transformer's 102 gradients, each codec
with error feedback, in ms (the launches, the per-call Python and the copies); and of what
the job compresses in a step: the partitions of its gradients of at least
BYTEPS_MIN_COMPRESS_BYTES (the rest travel raw, fused), also for dithering; every codec
also with each gradient's partitions compressed together (GRADPRESS_GROUP_PARTITIONS, the
worker's default); and with the job's compressed gradients fused into buckets of
``FUSED_BYTES`` (GRADPRESS_FUSE_COMPRESSED_BYTES, as DistributedOptimizer lays them out:
backward order), each bucket's members copied into its buffer (``torch.cat``) and its
partitions compressed together. ``gp_onebit_fused`` (run by default) and ``gp_topk_fused``
(jobs, variants) train with that setting.

The last line is ``RESULT {json}`` (``results.emit``: a record too, where asked).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [REPO, HERE]
from results import emit  # noqa: E402

from gradpress.config import Settings  # noqa: E402
from gradpress.pipeline.fusion import runs  # noqa: E402
from gradpress.placement import partition_counts  # noqa: E402

SETTINGS = {
    "gp_none": None,
    "gp_fp16": "Compression.fp16",
    "gp_onebit": {"compressor": "onebit", "scaling": True, "ef": "vanilla"},
    "gp_topk": {"compressor": "topk", "k": 0.01, "ef": "vanilla"},
    "gp_randomk": {"compressor": "randomk", "k": 0.0015, "seed": 1, "ef": "vanilla"},
    "gp_dithering": {"compressor": "dithering", "s": 7},
    "gp_powersgd": {"compressor": "powersgd", "rank": 4},
    "gp_acpsgd": {"compressor": "acpsgd", "rank": 4},
    "gp_auto": {"compressor": "auto", "k": 0.0015, "seed": 1},
}
# a setting run again with a worker setting changed (named in --systems; by default only
# gp_onebit_fused, the fastest setting on the H200)
VARIANTS = {"gp_none_gil200": ("gp_none", {"GRADPRESS_GIL_SWITCH_US": "200"}),
            "gp_onebit_gil200": ("gp_onebit", {"GRADPRESS_GIL_SWITCH_US": "200"}),
            "gp_none_apart": ("gp_none", {"GRADPRESS_LOCAL_REDUCE": "0"}),
            "gp_onebit_fused": ("gp_onebit", {"GRADPRESS_FUSE_COMPRESSED_BYTES": "fused"}),
            "gp_topk_fused": ("gp_topk", {"GRADPRESS_FUSE_COMPRESSED_BYTES": "fused"})}
FUSED_BYTES = 32 << 20  # the compressed gradients' buckets in the ``fused`` ways and variants (--fused-mib)
PEERS = ["ddp_gloo", "ddp_gloo_powersgd", "ddp_nccl", "ddp_nccl_powersgd"]
ENCODERS = {"onebit": {"compressor": "onebit", "scaling": True, "ef": "vanilla"},
            "topk": {"compressor": "topk", "k": 0.01, "ef": "vanilla"},
            "randomk": {"compressor": "randomk", "k": 0.0015, "seed": 1, "ef": "vanilla"},
            "fp16": {"compressor": "fp16", "ef": "vanilla"}}
# the codecs whose kernels compress a tensor's partitions at once (``encode_device_partitions``)
GROUPED = {**{name: ENCODERS[name] for name in ("onebit", "topk", "randomk", "fp16")},
           "dithering": {"compressor": "dithering", "s": 7, "seed": 1, "ef": "vanilla"}}


def timed(fn, reps: int) -> float:
    import torch
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def encoders(n: int, reps: int) -> dict:
    import torch

    from gradpress.compressors import build_compressor
    x = torch.randn(n, device="cuda")
    nbytes = 4 * n
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    out = {"card_read_GBps": nbytes / timed(lambda: x.sum(), reps) / 1e9,
           "card_d2h_pinned_GBps": nbytes / timed(lambda: pinned.view(torch.float32).copy_(x, non_blocking=True),
                                                  reps) / 1e9}
    k = max(1, int(0.01 * n))
    natives = {
        "onebit": lambda: pinned[: n // 8].copy_(_packbits(x >= 0), non_blocking=True),
        "topk": lambda: pinned.view(torch.float32)[:k].copy_(torch.topk(x.abs(), k, sorted=False).values,
                                                               non_blocking=True),
        "randomk": lambda: pinned.view(torch.float32)[: int(0.0015 * n)].copy_(
            x[torch.randint(n, (int(0.0015 * n),), device="cuda")], non_blocking=True),
        "fp16": lambda: pinned.view(torch.float16)[:n].copy_(x.half(), non_blocking=True),
    }
    for name, params in ENCODERS.items():
        codec = build_compressor(params, "worker")
        rounds = iter(range(10 ** 6))
        seconds = timed(lambda: codec.compress(x, key=1, round=next(rounds)), reps)
        native = timed(natives[name], reps)
        out[f"{name}_GBps"] = nbytes / seconds / 1e9
        out[f"{name}_torch_GBps"] = nbytes / native / 1e9
        out[f"{name}_over_torch"] = native / seconds
        out[f"{name}_over_card_read"] = out[f"{name}_GBps"] / out["card_read_GBps"]
    return out


def copies(n: int, reps: int) -> dict:
    """The worker's copies of a partition between the device and host memory of each kind it
    uses, in GB/s: pageable numpy, torch's pinned memory, a shared-memory chunk of its own
    registered with the driver (its push segment) and a peer's chunk mapped and registered
    (the server's result slots), unregistered too. ``*_registered`` says whether the
    driver took the registration."""
    import numpy as np
    import torch

    from gradpress.kernels.cuda import device
    from gradpress.net import shm
    x = torch.randn(n, device="cuda")
    own = shm.Arena("bench", chunk_bytes=4 * n, pin=lambda chunk: device.pin_host(chunk.map, chunk.nbytes))
    region = own.alloc(4 * n)
    theirs = shm.Arena("bench", chunk_bytes=4 * n).alloc(4 * n)  # as a server's: mapped here, then registered
    peer = shm.PeerChunks().region([os.getpid(), theirs.chunk.fd, theirs.chunk.inode, 0], 4 * n)
    other = shm.Arena("bench", chunk_bytes=4 * n).alloc(4 * n)
    unregistered = shm.PeerChunks().region([os.getpid(), other.chunk.fd, other.chunk.inode, 0], 4 * n)
    peer_pin = device.pin_host(peer.chunk.map, peer.chunk.nbytes)
    hosts = {"pageable": np.empty(n, np.float32), "torch_pinned": torch.empty(n, pin_memory=True).numpy(),
             "own_chunk": region.array("float32", n), "peer_chunk": peer.array("float32", n),
             "peer_chunk_unregistered": unregistered.array("float32", n)}
    out = {"copies_MB": 4 * n / 1e6, "own_chunk_registered": region.chunk.pinned is not None,
           "peer_chunk_registered": peer_pin is not None}
    for name, host in hosts.items():
        with device.working_on(x):
            out[f"d2h_{name}_GBps"] = 4 * n / timed(lambda: device.copy_to_host_into(x, host), reps) / 1e9
            out[f"h2d_{name}_GBps"] = 4 * n / timed(lambda: device.land_divided(host, x, 1), reps) / 1e9
    return out


def launches(reps: int) -> dict:
    """The compress stage of one step of the transformer (102 gradients), each codec with
    error feedback: every gradient compressed in turn as the worker does it, payloads to the
    host, the last one finished on the device. Milliseconds per step: the launches, numba's
    and torch's per-call Python and the copies; the goal is 2 ms."""
    import torch

    from bandwidth_models import MODELS
    from gradpress.compressors import build_compressor
    spec = MODELS["tfm"]
    model = spec.build().cuda()
    x, y = (t.cuda() for t in spec.batch(torch.Generator().manual_seed(1)))
    torch.nn.CrossEntropyLoss()(model(x), y).backward()
    grads = [p.grad.detach().reshape(-1) for p in model.parameters()]
    settings = Settings()
    job = _job_partitions(grads, settings)
    least = settings.min_compress_bytes
    out = {"tfm_tensors": len(grads), "tfm_job_partitions": sum(len(counts) for _, counts in job),
           "tfm_job_min_compress_bytes": least,
           "tfm_job_tensors": sum(1 for g in grads if g.numel() * 4 >= least)}
    ways = [(name, params, label, tensors, False) for name, params in ENCODERS.items()
            for label, tensors in (("", [(g, [g.numel()]) for g in grads]), ("job_", job))]
    ways += [("dithering", GROUPED["dithering"], "job_", job, False)]
    ways += [(name, params, "job_together_", job, True) for name, params in GROUPED.items()]
    buckets = fused_job(grads, settings, FUSED_BYTES)
    out["tfm_job_fused_buckets"] = len(buckets)
    fused = [(torch.cat(members) if len(members) > 1 else members[0], counts) for members, counts in buckets]
    ways += [(name, params, "job_fused_", fused, True) for name, params in GROUPED.items()]
    for name, params, label, tensors, together in ways:
        codec = build_compressor(params, "worker")
        rounds = iter(range(10 ** 6))

        def step(tensors=tensors, codec=codec, rounds=rounds, together=together, label=label):
            if label == "job_fused_":  # the bucket route's copy of its members into its buffer
                for (members, _), (buffer, _) in zip(buckets, tensors):
                    if len(members) > 1:
                        torch.cat(members, out=buffer)
            compress_stage(codec, tensors, next(rounds), together)
        out[f"{name}_{label}compress_stage_ms"] = 1e3 * timed(step, reps)
    return out


def fused_job(grads: list, settings: Settings, cap: int) -> list:
    """What a worker compresses in a step of the job with GRADPRESS_FUSE_COMPRESSED_BYTES=``cap``
    (``pipeline.fusion``): the gradients of at least BYTEPS_MIN_COMPRESS_BYTES, last first,
    in buckets of up to ``cap`` bytes (one of ``cap`` or more alone); each bucket's members
    (last first, as its buffer holds them) and its partitions' element counts."""
    coded = [g for g in grads if g.numel() * 4 >= settings.min_compress_bytes]
    small = [g for g in coded if g.numel() * 4 < cap]
    buckets = runs(small, cap, lambda a, b: True) + [[g] for g in coded if g.numel() * 4 >= cap]
    return [(members, partition_counts(sum(g.numel() for g in members), 4, settings.partition_bytes))
            for members in buckets]


def _job_partitions(grads: list, settings: Settings) -> list:
    """What a worker compresses in a step of the job: the gradients of at least
    BYTEPS_MIN_COMPRESS_BYTES (the smaller ones travel raw, fused), each with the element
    counts of its partitions (BYTEPS_PARTITION_BYTES)."""
    return [(g, partition_counts(g.numel(), 4, settings.partition_bytes)) for g in grads
            if g.numel() * 4 >= settings.min_compress_bytes]


def compress_stage(codec, tensors: list, step: int, together: bool) -> None:
    """One step's compress stage over ``tensors`` (a 1-D device array each, with its
    partitions' element counts), on gradpress's stream as the worker's: key by key (each
    partition a view), or, where ``together``, each tensor's partitions at once where the
    codec can (``compress_partitions``, as the worker's flight does; GRADPRESS_GROUP_PARTITIONS)."""
    from gradpress.kernels.cuda.device import working_on
    key = 0
    for whole, counts in tensors:
        keys = list(range(key, key + len(counts)))
        key += len(counts)
        with working_on(whole):
            if together and len(counts) > 1 and \
                    codec.compress_partitions(whole, keys, counts[0], rounds=[step] * len(keys)) is not None:
                continue
            start = 0
            for k, count in zip(keys, counts):
                codec.compress(whole[start:start + count], key=k, round=step)
                start += count


def _packbits(bits):
    import torch
    weights = (2 ** torch.arange(7, -1, -1, device=bits.device, dtype=torch.uint8))
    return (bits.view(-1, 8).to(torch.uint8) * weights).sum(1, dtype=torch.uint8)


WORKER = """
import json, os, statistics, sys, time, torch
sys.path[:0] = [{repo!r}, {here!r}]
from bandwidth_models import MODELS
system, out, iters = sys.argv[1], sys.argv[2], int(sys.argv[3])
rank = int(os.environ.get("DMLC_WORKER_ID", os.environ.get("GP_RANK", "0")))  # the launcher's workers are machines
device = torch.device(f"cuda:{{rank % torch.cuda.device_count()}}")
torch.cuda.set_device(device)
torch.manual_seed(0)
spec = MODELS["tfm"]
model = spec.build().to(device)
x, y = (t.to(device) for t in spec.batch(torch.Generator().manual_seed(1 + rank)))
loss_fn = torch.nn.CrossEntropyLoss()
finish = lambda: None
if system.startswith("gp_"):
    import gradpress.torch as bps
    bps.init()
    setting = json.loads(os.environ["GP_SETTING"])
    extra = {{"compression": bps.Compression.fp16}} if setting == "Compression.fp16" else \\
        ({{"compression_params": setting}} if setting else {{}})
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(), **extra)
    net, finish = model, bps.shutdown
elif system.startswith("ddp_"):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    backend = "nccl" if "nccl" in system else "gloo"
    dist.init_process_group(backend, init_method=os.environ["GP_INIT"], rank=rank, world_size=2)
    net = DistributedDataParallel(model, device_ids=[device.index],
                                  bucket_cap_mb=1024 if "powersgd" in system else 25)
    if "powersgd" in system:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
        net.register_comm_hook(powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                                      start_powerSGD_iter=2), powersgd.powerSGD_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    finish = dist.destroy_process_group
else:  # compute only
    net, opt = model, torch.optim.SGD(model.parameters(), lr=0.01)
times, sampler = [], None
# where a step goes: the backward pass as the host sees it (the call) and as the device ran
# it (events on the training stream around the call): a host span far over the device's
# own work means the host was slow to queue kernels (the hooks waiting), not the device
backwards, marks = [], (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))


def step():
    torch.cuda.synchronize()
    t = time.perf_counter()
    opt.zero_grad()
    loss = loss_fn(net(x), y)
    marks[0].record()
    t_backward = time.perf_counter()
    loss.backward()
    t_backward = time.perf_counter() - t_backward
    marks[1].record()
    opt.step()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
    backwards.append((t_backward, marks[0].elapsed_time(marks[1]) / 1e3))


def threads_cpu_s() -> dict:  # CPU seconds of each thread so far, by Python's name where it has one
    import threading
    from gradpress.host import thread_cpu_s
    python = {{t.native_id: t.name for t in threading.enumerate()}}
    return {{f"{{python.get(tid, name)}}-{{tid}}": cpu for (name, tid), cpu in thread_cpu_s().items()}}


for _ in range(12):
    step()
if system == "gp_auto":  # timed once every worker holds its settled plan (its trials over), as bandwidth.py
    from bandwidth_worker import AUTO_MAX_EXTRA_WARMUP, everyone_planned
    while not everyone_planned(bps, opt) and len(times) < 12 + AUTO_MAX_EXTRA_WARMUP:
        step()
    for _ in range(4):  # the settled plan's first steps set up its keys
        step()
if rank == 0 and os.environ.get("GP_PROFILE"):
    from stack_sampler import StackSampler
    sampler = StackSampler()
    sampler.start()
cpu_before = threads_cpu_s()
for _ in range(iters):
    step()
cpu_after = threads_cpu_s()
if sampler:
    sampler.report(os.environ["GP_PROFILE"], f"{{system}}: {{iters}} steps")
plan = getattr(opt, "gradpress_plan", None)
busy = {{k: (v - cpu_before.get(k, 0.0)) / iters for k, v in cpu_after.items()}}
with open(out + f".{{rank}}", "w") as fh:
    planner = getattr(getattr(opt, "_gradpress", None), "planner", None)
    json.dump({{"s": statistics.median(times[-iters:]), "predicted_s": getattr(plan, "predicted_s", None),
               "plan": plan.summary() if plan is not None else None,
               "trials": [f"{{p.summary()}}: {{m:.4f}} s ({{t:.4f}})"
                          for p, m, t in getattr(planner, "measured_plans", [])] or None,
               # the model's cost per partition, and the probe's where it was fitted to the profiled steps
               "message_ms": [round(1e3 * v, 4) for v in (profile.message_s, profile.notes.get("message_s_probed"))
                              if v is not None] if (profile := getattr(planner, "profile", None)) else None,
               "backward_host_s": statistics.median(b[0] for b in backwards[-iters:]),
               "backward_device_s": statistics.median(b[1] for b in backwards[-iters:]),
               "thread_cpu_s": {{k: round(v, 5) for k, v in sorted(busy.items(), key=lambda kv: -kv[1])[:8]
                                if v > 0}}}}, fh)
finish()
"""


def _wait_group(procs: list, seconds: float) -> None:
    """Wait for every process; past the deadline kill each one's whole group (the launcher's
    servers and workers too) so a stuck setting cannot hold the GPU for the next one."""
    deadline = time.monotonic() + seconds
    try:
        for p in procs:
            if p.wait(timeout=max(1.0, deadline - time.monotonic())) != 0:
                raise RuntimeError(f"exit status {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()


def run_job(system: str, iters: int, tmp: str, timeout: float) -> dict:
    script = os.path.join(tmp, "worker.py")
    with open(script, "w") as fh:
        fh.write(WORKER.format(repo=REPO, here=HERE))
    out = os.path.join(tmp, system)
    env = dict(os.environ, GRADPRESS_PLAN_STEPS="4")
    if system.startswith("gp_"):
        base, changed = VARIANTS.get(system, (system, {}))
        changed = {k: str(FUSED_BYTES) if v == "fused" else v for k, v in changed.items()}
        env.update(changed, GP_SETTING=json.dumps(SETTINGS[base]))
        cmd = [sys.executable, "-m", "gradpress.launcher", "--local", "--workers", "2", "--servers", "2", "--",
               sys.executable, script, system, out, str(iters)]
        _wait_group([subprocess.Popen(cmd, env=env, start_new_session=True)], timeout)
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [subprocess.Popen([sys.executable, script, system, out, str(iters)],
                                  env=dict(env, GP_RANK=str(r), GP_INIT=f"tcp://127.0.0.1:{port}"),
                                  start_new_session=True) for r in range(2)]
        _wait_group(procs, timeout)
    records = []
    for r in range(2):
        with open(f"{out}.{r}") as fh:
            records.append(json.load(fh))
    return {"s": max(rec["s"] for rec in records), "predicted_s": records[0]["predicted_s"],
            **{part: records[0].get(part) for part in ("backward_host_s", "backward_device_s", "thread_cpu_s",
                                                       "plan", "trials", "message_ms")}}


def jobs(iters: int, timeout: float, only: list | None) -> dict:
    import torch
    systems = ["compute"] + list(SETTINGS) + ["gp_onebit_fused"] + \
        [p for p in PEERS if "nccl" not in p or torch.cuda.device_count() > 1]
    systems = [s for s in dict.fromkeys(systems + list(VARIANTS)) if s in only] if only else systems
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for system in systems:
            try:
                result = run_job(system, iters, tmp, timeout)
            except (subprocess.SubprocessError, RuntimeError, OSError) as e:
                print(f"{system}: failed: {e}", flush=True)
                continue
            out[f"tfm_{system}_s_per_iter"] = result["s"]
            for part in ("predicted_s", "backward_host_s", "backward_device_s", "thread_cpu_s", "plan", "trials",
                         "message_ms"):
                if result[part] is not None:  # (worker 0's backward and threads; auto's plan and trials)
                    out[f"tfm_{system}_{part}"] = result[part]
            print(f"{system:>20}  {result['s']:.4f} s/iter" + (f"  plan {result['plan']}; trials: "
                                                               f"{'; '.join(result['trials'] or [])}"
                                                               if result["plan"] else ""), flush=True)
    compute = out.get("tfm_compute_s_per_iter")
    gp = {k: v for k, v in out.items() if k.startswith("tfm_gp_") and k.endswith("_s_per_iter")}
    if compute:
        for key, value in gp.items():
            out[key.replace("_s_per_iter", "_over_compute")] = value / compute
    ddp = out.get("tfm_ddp_gloo_s_per_iter")
    if ddp and gp:
        out["fastest_gp_over_ddp_gloo"] = min(gp.values()) / ddp
    return out


def main() -> int:
    global FUSED_BYTES  # one setting for the whole run, read by the parts
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and iterations")
    ap.add_argument("--parts", default="copies,encoders,launches,jobs")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--job-timeout", type=float, default=600, help="seconds one setting's job may take")
    ap.add_argument("--profile", default="", help="append worker 0's sampled stacks of each job to this file")
    ap.add_argument("--systems", default="", help="comma-separated subset of the jobs (default: all)")
    ap.add_argument("--fused-mib", type=int, default=FUSED_BYTES >> 20,
                    help="the buckets of the fused ways and variants (GRADPRESS_FUSE_COMPRESSED_BYTES), MiB")
    args = ap.parse_args()
    FUSED_BYTES = args.fused_mib << 20
    import torch
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py: torch sees no CUDA GPU here; nothing measured")
        print("RESULT {}")  # nothing measured: no record
        return 0
    result = {"card": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(), "fused_bytes": FUSED_BYTES}
    parts = args.parts.split(",")
    if "encoders" in parts:
        result.update(encoders(64 << 20, 5 if args.quick else 20))
        for key, value in result.items():
            if key.endswith(("_GBps", "_over_torch", "_over_card_read")):
                print(f"{key:>28}  {value:.3f}")
    if "copies" in parts:
        result.update(copies(16 << 20, 5 if args.quick else 20))
        for key, value in result.items():
            if key.startswith(("d2h_", "h2d_")) or key.endswith("_registered"):
                print(f"{key:>34}  {value}")
    if "launches" in parts:
        result.update(launches(5 if args.quick else 20))
        for key, value in result.items():
            if key.endswith("_compress_stage_ms"):
                print(f"{key:>28}  {value:.3f}")
    if "jobs" in parts:
        only = [s for s in args.systems.split(",") if s]
        if args.profile:
            os.environ["GP_PROFILE"] = os.path.abspath(args.profile)
        result.update(jobs(8 if args.quick else args.iters, args.job_timeout, only))
    emit("gpu", {k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
