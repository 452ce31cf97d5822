"""What runs inside a worker's namespace for ``benchmarks/bandwidth.py``: the training loop.

    python benchmarks/bandwidth_worker.py _train SYSTEM MODEL WARMUP ITERS OUT DDP_RANK DDP_ADDR DDP_PORT
    python benchmarks/bandwidth_worker.py _compute MODEL ITERS

The loop is the same for every system: one fixed batch per worker (bandwidth_models.py),
cross-entropy, SGD lr 0.01, one thread. A system is gradpress with a ``compression_params``
dictionary (``None``: uncompressed), torch DDP (gloo), or DDP with the PowerSGD hook.
"""
from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from pathlib import Path

from bandwidth_models import MODELS

from gradpress import host

GP_COMPRESSION = {
    "gp_none": None,
    "gp_onebit": {"compressor": "onebit", "ef": "vanilla", "scaling": True},
    "gp_topk": {"compressor": "topk", "k": 0.01, "ef": "vanilla"},
    # randomk sends float32 values only (indices come from the shared seed): against
    # fp16 that is 2 / (4 k) = 333x for k = 1 / 666
    "gp_randomk": {"compressor": "randomk", "k": 0.0015, "ef": "vanilla", "seed": 1},
    # the planner (gradpress/planner) picks each tensor's codec and fusion from profiles
    # the default options, with randomk at gp_randomk's k and seed ("randomk at the user's k")
    "gp_auto": {"compressor": "auto", "k": 0.0015, "seed": 1},
    "gp_auto_lr": {"compressor": "auto", "k": 0.0015, "seed": 1,
                   "allowed": ["onebit", "topk", "randomk", "fp16", "none", {"compressor": "acpsgd", "rank": 1}]},
    # low-rank factors (gradpress/pipeline/lowrank.py); rank 1 is what ddp_powersgd uses
    "gp_powersgd": {"compressor": "powersgd", "rank": 1},
    "gp_acpsgd": {"compressor": "acpsgd", "rank": 1},
    "gp_acpsgd_r4": {"compressor": "acpsgd", "rank": 4},
}
DDP_SYSTEMS = ["ddp", "ddp_powersgd"]
LR = 0.01
NUM_WORKERS = 2
POWERSGD_START_ITER = 2  # the smallest PyTorch allows with error feedback / warm start
# gp_auto profiles for some steps before it plans; its timed iterations start once every
# worker has the plan, or after this many extra warm-up iterations (then it is a miss)
AUTO_MAX_EXTRA_WARMUP = 70
IFACE = "eth0"


def tx_bytes() -> int:
    return int(Path(f"/sys/class/net/{IFACE}/statistics/tx_bytes").read_text())


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds of each of this process's threads so far, by ``name-tid``."""
    return {f"{name}-{tid}": cpu for (name, tid), cpu in host.thread_cpu_s().items()}


def predicted_s(opt) -> float | None:
    """The planner's predicted iteration time, None before it has planned (or without one)."""
    plan = getattr(opt, "gradpress_plan", None)
    return getattr(plan, "predicted_s", None)


def measured_plans(opt) -> list[tuple[str, float, float]]:
    """The plans the planner ran and measured before it settled (its last trial): each one's
    measured median and modelled seconds."""
    planner = getattr(getattr(opt, "_gradpress", None), "planner", None)
    return [(plan.summary(), round(s, 4), round(t, 4)) for plan, s, t in getattr(planner, "measured_plans", [])]


def host_share(opt) -> dict | None:
    """Who the planner found sharing rank 0's CPUs, and the training's CPU it measured."""
    profile = getattr(getattr(getattr(opt, "_gradpress", None), "planner", None), "profile", None)
    return vars(profile.host) if profile is not None and profile.host is not None else None


def everyone_planned(bps, opt) -> bool:
    """Whether every worker holds its settled plan (the one re-based on the backward measured
    under the first): all must leave the warm-up at the same iteration."""
    import torch
    plan = getattr(opt, "gradpress_plan", None)
    flag = torch.tensor([1.0 if plan is not None and plan.refined else 0.0])
    return bps.push_pull(flag, average=False, name="bandwidth.planned").item() == NUM_WORKERS


def train(system: str, model_name: str, warmup: int, iters: int, out: str, ddp_rank: int, ddp_addr: str,
          ddp_port: int) -> None:
    """Run the loop as one worker of ``system`` and write times, bytes and losses to ``out``."""
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same initial model on every worker
    spec = MODELS[model_name]
    model = spec.build()
    count = sum(p.numel() for p in model.parameters())
    if count != spec.params:
        raise SystemExit(f"model {model_name} has {count} parameters; bandwidth_models.py says {spec.params}")
    bps = None
    if system.startswith("gp_"):
        import gradpress.torch as bps
        bps.init()
        rank = bps.rank()
        params = GP_COMPRESSION[system]
        extra = {} if params is None else {"compression_params": params}
        opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                       named_parameters=model.named_parameters(), **extra)
        net, finish = model, bps.shutdown
    else:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        dist.init_process_group("gloo", init_method=f"tcp://{ddp_addr}:{ddp_port}", rank=ddp_rank,
                                world_size=NUM_WORKERS)
        rank = ddp_rank
        net = DistributedDataParallel(model, bucket_cap_mb=1024 if system == "ddp_powersgd" else 25)
        if system == "ddp_powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
            state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                           start_powerSGD_iter=POWERSGD_START_ITER)
            net.register_comm_hook(state, powersgd.powerSGD_hook)
        opt = torch.optim.SGD(net.parameters(), lr=LR)
        finish = dist.destroy_process_group
    x, y = spec.batch(torch.Generator().manual_seed(1 + rank))
    loss_fn = torch.nn.CrossEntropyLoss()
    times, losses, predictions = [], [], []

    phases = []  # (forward, backward, step) seconds: where an iteration's time goes

    def step() -> None:
        t = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        t_forward = time.perf_counter()
        loss.backward()
        t_backward = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t)
        phases.append((t_forward - t, t_backward - t_forward, time.perf_counter() - t_backward))
        losses.append(loss.item())
        predictions.append(predicted_s(opt))

    for _ in range(warmup):
        step()
    planned_at = None
    if system.startswith("gp_auto"):
        while not everyone_planned(bps, opt) and len(times) < warmup + AUTO_MAX_EXTRA_WARMUP:
            step()
        if predicted_s(opt) is not None:
            planned_at = len(times)
            for _ in range(max(1, warmup)):  # the first planned iterations set up fused keys
                step()
    first = len(times)
    tx0, use0, threads0 = tx_bytes(), resource.getrusage(resource.RUSAGE_SELF), thread_cpu_s()
    for _ in range(iters):
        step()
    sent, use, threads = tx_bytes() - tx0, resource.getrusage(resource.RUSAGE_SELF), thread_cpu_s()
    # where a worker's time goes beside the model: every thread's CPU, and the page faults of
    # memory the process had to be given afresh (costly on this VM)
    cpu_s = (use.ru_utime + use.ru_stime - use0.ru_utime - use0.ru_stime) / iters
    faults = (use.ru_minflt - use0.ru_minflt) / iters
    per_thread = {t: round((c - threads0.get(t, 0.0)) / iters, 4) for t, c in threads.items()
                  if c - threads0.get(t, 0.0) > 0}
    with open(out, "w") as fh:
        json.dump({"rank": rank, "times": times[first:], "warmup_times": times[:first], "tx_bytes": sent,
                   "cpu_s_per_iter": cpu_s, "page_faults_per_iter": faults,
                   "thread_cpu_s_per_iter": per_thread, "losses": losses,
                   "predicted_s": predictions[first:], "planned_at": planned_at, "phases_s": phases[first:],
                   "measured_plans": measured_plans(opt), "host_share": host_share(opt)}, fh)
    finish()


def compute_only(model_name: str, iters: int, keep_freed_memory: bool, rank: int = 0, warmup: int = 2,
                 after_backward=None) -> float:
    """Median seconds of the same loop in one process, no communication: the floor. With
    ``keep_freed_memory``, malloc set as gradpress's workers set it (``gradpress/allocator.py``);
    ``rank`` picks the worker's batch; ``after_backward(params, step)``, if given, runs
    between backward and the optimizer step and is timed with it (host_floor.py)."""
    import torch
    if keep_freed_memory:
        from gradpress.allocator import keep_freed_memory as keep
        if not keep():
            raise SystemExit("bandwidth_worker.py: glibc's mallopt is not available here")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = MODELS[model_name]
    model = spec.build()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = spec.batch(torch.Generator().manual_seed(1 + rank))
    loss_fn = torch.nn.CrossEntropyLoss()
    params = list(model.parameters())
    times = []
    for step in range(warmup + iters):
        t = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        if after_backward is not None:
            after_backward(params, step)
        opt.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times[warmup:])


if __name__ == "__main__":
    if sys.argv[1:2] == ["_train"]:
        system, model_name, warmup, iters, out, ddp_rank, ddp_addr, ddp_port = sys.argv[2:10]
        train(system, model_name, int(warmup), int(iters), out, int(ddp_rank), ddp_addr, int(ddp_port))
    elif sys.argv[1:2] == ["_compute"]:
        print(compute_only(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "kept"))
    else:
        sys.exit(__doc__)
