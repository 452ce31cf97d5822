"""Training over slow links: gradpress, compressed and not, against torch DDP.

    flock /tmp/gp-cpu.lock .venv/bin/python benchmarks/bandwidth.py [--rates 100mbit,1gbit]
        [--systems gp_none,gp_onebit,gp_topk,gp_randomk,ddp,ddp_powersgd] [--iters N]
        [--warmup N] [--quick] [--chart docs/bandwidth.png] [--trace DIR] [--json FILE]

Needs root. Every node gets a network namespace of its own (gradpress/testing/netns.py): a
scheduler, 2 servers and 2 workers for gradpress, the 2 workers' namespaces for DDP. Each
node's link is limited by ``tc tbf`` to the rate, in both directions; traffic stays in a
private 10.251.x.0/24 with no route out, and the namespaces are removed at the end, on
an error and on SIGINT/SIGTERM/SIGHUP.

The training loop is the same for every system: an MLP 1024-4096-4096-1024 (ReLU;
25,175,040 parameters, 100.7 MB of float32 gradients), one fixed synthetic batch of 32
per worker, cross-entropy, SGD lr 0.01, one thread per worker (OMP_NUM_THREADS=1).

- ``gp_none``: gradpress, uncompressed.
- ``gp_onebit``: two-way onebit (scaled sign) with vanilla error feedback.
- ``gp_topk``: two-way topk, k = 1%, vanilla error feedback.
- ``gp_randomk``: two-way randomk, k = 0.15% (333x against fp16), vanilla EF, seed 1.
- ``ddp``: ``torch.distributed`` gloo DDP.
- ``ddp_powersgd``: the same with PyTorch's PowerSGD hook (rank 1, one gradient
  bucket: with gloo the hook deadlocks with several buckets; its first 2 iterations
  are plain all-reduce, so it always gets at least 3 warm-up iterations).

Seconds per iteration: median of worker 0's iterations (zero_grad to step) after the
warm-up. Bytes sent: what each worker's ``eth0`` counted (``tx_bytes``: payload, TCP/IP
headers, ACKs) over the timed iterations, per iteration, mean of the 2 workers.
The same loop in one process without communication is timed first (the floor).
The last line is ``RESULT {json}`` with ``<rate>_<system>_s_per_iter``,
``<rate>_<system>_MB_per_iter`` (null where a run failed) and ``compute_only_s_per_iter``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

from gradpress.testing import netns  # noqa: E402

SYSTEMS = ["gp_none", "gp_onebit", "gp_topk", "gp_randomk", "ddp", "ddp_powersgd"]
COMPRESSION = {
    "gp_none": None,
    "gp_onebit": {"compressor": "onebit", "ef": "vanilla", "scaling": True},
    "gp_topk": {"compressor": "topk", "k": 0.01, "ef": "vanilla"},
    # randomk sends float32 values only (indices come from the shared seed): against
    # fp16 that is 2 / (4 k) = 333x for k = 1 / 666
    "gp_randomk": {"compressor": "randomk", "k": 0.0015, "ef": "vanilla", "seed": 1},
}
LAYERS = [1024, 4096, 4096, 1024]
BATCH = 32
LR = 0.01
NUM_WORKERS, NUM_SERVERS = 2, 2
POWERSGD_START_ITER = 2  # the smallest PyTorch allows with error feedback / warm start
BASE_PORT = 9100
IFACE = "eth0"


# ---- inside a worker's namespace: the training loop ----

def build_model():
    import torch
    layers = []
    for i, (a, b) in enumerate(zip(LAYERS, LAYERS[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(LAYERS) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def tx_bytes() -> int:
    return int(Path(f"/sys/class/net/{IFACE}/statistics/tx_bytes").read_text())


def train(system: str, warmup: int, iters: int, out: str, ddp_rank: int, ddp_addr: str, ddp_port: int) -> None:
    """Run the loop as one worker of ``system`` and write times, bytes and losses to ``out``."""
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same initial model on every worker
    model = build_model()
    if system.startswith("gp_"):
        import gradpress.torch as bps
        bps.init()
        rank = bps.rank()
        extra = {} if COMPRESSION[system] is None else {"compression_params": COMPRESSION[system]}
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
    gen = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(BATCH, LAYERS[0], generator=gen)
    y = torch.randint(LAYERS[-1], (BATCH,), generator=gen)
    loss_fn = torch.nn.CrossEntropyLoss()
    times, losses = [], []
    tx0 = None
    for i in range(warmup + iters):
        if i == warmup:
            tx0 = tx_bytes()
        t = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
    sent = tx_bytes() - tx0
    with open(out, "w") as fh:
        json.dump({"rank": rank, "times": times[warmup:], "warmup_times": times[:warmup], "tx_bytes": sent,
                   "losses": losses}, fh)
    finish()


def compute_only(iters: int) -> float:
    """Median seconds of the same loop in one process, no communication: the floor."""
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = torch.randn(BATCH, LAYERS[0]), torch.randint(LAYERS[-1], (BATCH,))
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for _ in range(2 + iters):
        t = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:])


# ---- the harness: namespaces, processes, figures ----

class RunFailed(Exception):
    pass


def python_env(**extra: str) -> dict:
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": str(REPO),
           "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HOME": os.environ.get("HOME", "/root"),
           "NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR", "")}
    env.update(extra)
    return {k: v for k, v in env.items() if v != ""}


def run_once(cluster: netns.NetnsCluster, system: str, warmup: int, iters: int, port: int, tmp: Path,
             deadline_s: float, trace_dir: str | None = None) -> list[dict]:
    """One job of ``system`` on the cluster as shaped now; returns each worker's record."""
    procs: dict[str, tuple] = {}
    tag = f"{cluster.rate}_{system}"
    worker_cmd = [sys.executable, str(Path(__file__).resolve()), "_train", system, str(warmup), str(iters)]
    try:
        if system.startswith("gp_"):
            # the caller's gradpress settings apply (e.g. BYTEPS_SCHEDULING_CREDIT); the job's wiring wins
            passed = {k: v for k, v in os.environ.items() if k.startswith(("BYTEPS_", "GRADPRESS_"))}
            common = dict(**passed)
            common.update(DMLC_PS_ROOT_URI=cluster.addr("sched"), DMLC_PS_ROOT_PORT=str(port),
                          DMLC_NUM_WORKER=str(NUM_WORKERS), DMLC_NUM_SERVER=str(NUM_SERVERS),
                          GRADPRESS_OP_TIMEOUT_S=str(int(deadline_s)), GRADPRESS_SHM="0")
            role = [sys.executable, "-m", "gradpress.launcher"]
            nodes = [("sched", role, dict(DMLC_ROLE="scheduler"))]
            nodes += [(f"s{i}", role, dict(DMLC_ROLE="server")) for i in range(NUM_SERVERS)]
            nodes += [(f"w{i}", worker_cmd + [str(tmp / f"{tag}_w{i}.json"), "0", "", "0"],
                       dict(DMLC_ROLE="worker", DMLC_WORKER_ID=str(i), BYTEPS_LOCAL_RANK="0",
                            BYTEPS_LOCAL_SIZE="1")) for i in range(NUM_WORKERS)]
            for name, argv, env in nodes:
                if trace_dir and name.startswith("w"):
                    env["GRADPRESS_TRACE"] = str(Path(trace_dir).resolve() / f"{tag}_{name}.json")
                env = python_env(**common, **env, DMLC_NODE_HOST=cluster.addr(name))
                procs[name] = (cluster.popen(name, argv, env, tmp / f"{tag}_{name}.log", cwd=str(REPO)),
                               tmp / f"{tag}_{name}.log")
        else:
            for i in range(NUM_WORKERS):
                name = f"w{i}"
                argv = worker_cmd + [str(tmp / f"{tag}_w{i}.json"), str(i), cluster.addr("w0"), str(port)]
                env = python_env(GLOO_SOCKET_IFNAME=IFACE)
                procs[name] = (cluster.popen(name, argv, env, tmp / f"{tag}_{name}.log", cwd=str(REPO)),
                               tmp / f"{tag}_{name}.log")
        workers = [n for n in procs if n.startswith("w")]
        end = time.monotonic() + deadline_s
        while not all(procs[n][0].poll() == 0 for n in workers):
            failed = [n for n, (p, _) in procs.items() if p.poll() not in (None, 0)]
            if failed:
                raise RunFailed(f"{tag}: {failed} exited with an error\n" + tails(procs))
            if time.monotonic() > end:
                raise RunFailed(f"{tag}: workers not done within {deadline_s:.0f} s\n" + tails(procs))
            time.sleep(0.2)
        end = time.monotonic() + 30
        while any(p.poll() is None for p, _ in procs.values()) and time.monotonic() < end:
            time.sleep(0.2)
        late = [n for n, (p, _) in procs.items() if p.poll() is None]
        if late:
            print(f"  note: {late} still running 30 s after the workers finished; stopped", flush=True)
        return [json.loads((tmp / f"{tag}_w{i}.json").read_text()) for i in range(NUM_WORKERS)]
    finally:
        for p, _ in procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 9)
                except ProcessLookupError:
                    pass
                p.wait()


def tails(procs: dict, lines: int = 15) -> str:
    out = []
    for name, (p, log) in procs.items():
        text = log.read_text(errors="replace").splitlines() if log.exists() else []
        out.append(f"--- {name} (exit {p.poll()}):\n" + "\n".join(text[-lines:]))
    return "\n".join(out)


def plan(rate: str, system: str, args) -> tuple[int, int]:
    """(warm-up, timed) iterations: few where an iteration takes many seconds."""
    slow = system in ("gp_none", "ddp") and netns.rate_bits(rate) < 5e8
    iters = args.iters or ((2 if slow else 3) if args.quick else (3 if slow else 8))
    warmup = args.warmup if args.warmup is not None else (1 if slow or args.quick else 2)
    if system == "ddp_powersgd":
        warmup = max(warmup, POWERSGD_START_ITER + 1)
    return warmup, iters


def deadline(rate: str, warmup: int, iters: int) -> float:
    """Generous: an uncompressed iteration moves about 2 x 100 MB through a worker's link."""
    per_iter = 2 * 101e6 * 8 / netns.rate_bits(rate)
    return 120 + 3 * per_iter * (warmup + iters)


def chart(rows: list[dict], rates: list[str], systems: list[str], path: Path, floor: float | None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(systems)
    for j, system in enumerate(systems):
        xs, ys = [], []
        for i, rate in enumerate(rates):
            r = next((r for r in rows if r["rate"] == rate and r["system"] == system), None)
            if r and r["s_per_iter"] is not None:
                xs.append(i + (j - (len(systems) - 1) / 2) * width)
                ys.append(r["s_per_iter"])
        bars = ax.bar(xs, ys, width, label=system)
        ax.bar_label(bars, labels=[f"{y:.3g}" for y in ys], fontsize=7)
    if floor is not None:
        ax.axhline(floor, color="black", linestyle=":", linewidth=1, label="compute only")
    ax.set_yscale("log")
    ax.set_xticks(range(len(rates)), [f"{r} per link" for r in rates])
    ax.set_ylabel("seconds per iteration (log)")
    ax.set_title(f"MLP {'-'.join(map(str, LAYERS))} (25.2M params), 2 workers, batch {BATCH}; lower is better",
                 fontsize=9)
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="100mbit,1gbit", help="link rates, comma-separated (100mbit, 1gbit, ...)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    p.add_argument("--iters", type=int, help="timed iterations (default: 3 where slow, 8 otherwise)")
    p.add_argument("--warmup", type=int, help="warm-up iterations (default: 1 where slow, 2 otherwise)")
    p.add_argument("--quick", action="store_true", help="fewer iterations (a few minutes in all)")
    p.add_argument("--chart", default=str(REPO / "docs" / "bandwidth.png"), help="PNG to write ('' for none)")
    p.add_argument("--trace", metavar="DIR", help="gradpress workers write Chrome traces (GRADPRESS_TRACE) here")
    p.add_argument("--json", help="also write every record (times, bytes, losses) to this file")
    args = p.parse_args()
    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for r in rates:
        netns.rate_bits(r)
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {SYSTEMS}")
    why = netns.check_allowed()
    if why:
        print(f"bandwidth.py: {why}", file=sys.stderr)
        return 2

    netns.cleanup_on_signals()
    try:
        floor = float(subprocess.run([sys.executable, str(Path(__file__).resolve()), "_compute", "8"], check=True,
                                     capture_output=True, text=True, env=python_env()).stdout.split()[-1])
        print(f"compute only (1 process, 1 thread, no communication): {floor:.3f} s/iter", flush=True)
        rows = measure(rates, systems, args)
    except netns.Interrupted as e:
        print(f"bandwidth.py: {e}; namespaces removed", file=sys.stderr)
        return 130
    report(rows, rates, systems, args, floor)
    return 0


def measure(rates: list[str], systems: list[str], args) -> list[dict]:
    """Every (rate, system) once, in one set of namespaces reshaped per rate."""
    rows: list[dict] = []
    port = BASE_PORT
    cluster = netns.NetnsCluster()
    try:
        with cluster, tempfile.TemporaryDirectory(prefix="gp-bandwidth-") as tmpdir:
            for name in ["sched"] + [f"s{i}" for i in range(NUM_SERVERS)] + [f"w{i}" for i in range(NUM_WORKERS)]:
                cluster.add_node(name)
            print(f"namespaces {cluster.prefix}-*, subnet {cluster.subnet}.0/24", flush=True)
            for rate in rates:
                cluster.shape(rate)
                for system in systems:
                    warmup, iters = plan(rate, system, args)
                    port += 1
                    t0 = time.monotonic()
                    print(f"{rate} {system}: {warmup} warm-up + {iters} timed iterations ...", flush=True)
                    row = {"rate": rate, "system": system, "s_per_iter": None, "MB_per_iter": None}
                    try:
                        recs = run_once(cluster, system, warmup, iters, port, Path(tmpdir), deadline(rate, warmup, iters),
                                        args.trace)
                        rec0 = next(r for r in recs if r["rank"] == 0)
                        row.update(s_per_iter=statistics.median(rec0["times"]),
                                   MB_per_iter=statistics.mean(r["tx_bytes"] for r in recs) / iters / 1e6,
                                   loss_first=rec0["losses"][0], loss_last=rec0["losses"][-1], records=recs)
                        print(f"  {row['s_per_iter']:.3f} s/iter, {row['MB_per_iter']:.2f} MB sent per iter per "
                              f"worker; times {[round(t, 3) for t in rec0['times']]}; "
                              f"{time.monotonic() - t0:.0f} s in all", flush=True)
                    except RunFailed as e:
                        row["error"] = str(e).splitlines()[0]
                        print(f"  FAILED: {e}", flush=True)
                    rows.append(row)
    finally:
        cluster.remove()  # again: __exit__ does not run when __enter__ failed half-way
        left = cluster.leftovers()
        if left:
            print(f"bandwidth.py: could not remove {left}", file=sys.stderr)
    return rows


def report(rows: list[dict], rates: list[str], systems: list[str], args, floor: float) -> None:
    base = {r["rate"]: r["s_per_iter"] for r in rows if r["system"] == "gp_none"}
    print()
    print(f"{'rate':8s} {'system':13s} {'s/iter':>9s} {'MB sent/iter/worker':>20s} {'vs gp_none':>11s} "
          f"{'loss first -> last':>20s}")
    for r in rows:
        s, mb, b = r["s_per_iter"], r["MB_per_iter"], base.get(r["rate"])
        speed = f"{b / s:10.1f}x" if s and b else f"{'':>11s}"
        loss = f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}" if "loss_first" in r else r.get("error", "")[:40]
        print(f"{r['rate']:8s} {r['system']:13s} {s if s is not None else float('nan'):9.3f} "
              f"{mb if mb is not None else float('nan'):20.2f} {speed} {loss:>20s}")
    if args.chart:
        chart(rows, rates, systems, Path(args.chart), floor)
        print(f"chart: {args.chart}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"compute only (no communication): {floor:.3f} s/iter")
    result = {"compute_only_s_per_iter": round(floor, 4)}
    for r in rows:
        result[f"{r['rate']}_{r['system']}_s_per_iter"] = None if r["s_per_iter"] is None else round(r["s_per_iter"], 4)
        result[f"{r['rate']}_{r['system']}_MB_per_iter"] = None if r["MB_per_iter"] is None else round(r["MB_per_iter"], 3)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_train":
        # inside a worker's namespace: _train SYSTEM WARMUP ITERS OUT DDP_RANK DDP_ADDR DDP_PORT
        system, warmup, iters, out, ddp_rank, ddp_addr, ddp_port = sys.argv[2:9]
        train(system, int(warmup), int(iters), out, int(ddp_rank), ddp_addr, int(ddp_port))
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "_compute":
        print(compute_only(int(sys.argv[2])))
        sys.exit(0)
    sys.exit(main())
