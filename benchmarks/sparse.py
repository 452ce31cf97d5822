"""A recommendation-style model over 1 Gbit/s links: sparse embedding gradients sent as rows
(gradpress), dense (gradpress), and dense through torch DDP.

    flock /tmp/gp-cpu.lock .venv/bin/python benchmarks/sparse.py [--rate 1gbit] [--rows 1000000]
        [--width 64] [--batch 256] [--bag 16] [--warmup 2] [--iters 4] [--systems gp_sparse,gp_dense,ddp]
        [--json FILE]

Needs root. A scheduler, 2 servers and 4 workers each get a network namespace
(gradpress/testing/netns.py) whose link ``tc tbf`` limits to the rate both ways; DDP runs
in the 4 workers' namespaces.

Model: an ``EmbeddingBag`` table of rows x width (1M x 64 = 64M parameters, 256 MB)
averaged over bags of ``bag`` ids, then an MLP width-128-1; MSE against a synthetic target, SGD lr
0.01, one thread per worker. Ids are Zipf-distributed (exponent 1.1, folded into the table
by ``(z - 1) mod rows``); each worker cycles through 4 batches of its own, drawn before
timing starts.

- ``gp_sparse``: gradpress, the table's gradient sparse (``sparse=True``): its touched rows
  travel, hashed over the 2 servers, and every worker pulls the union.
- ``gp_dense``: gradpress, the same model with a dense table gradient
  (``GRADPRESS_SPARSE_DENSITY=0``, so it is not found mostly-zero and sent as rows).
- ``ddp``: torch ``DistributedDataParallel`` (gloo), dense gradients.

Seconds per iteration: median of worker 0's timed iterations (zero_grad to step).
``hash_imbalance`` / ``range_imbalance``: the rows the servers receive (each worker's
batch coalesced, over the timed iterations' batches of all 4 workers) under the row hash
gradpress uses and under contiguous ranges; the maximum over servers divided by the mean.
The last line is ``RESULT {json}``.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

from bandwidth import RunFailed, python_env, stop_all, wait_for_workers  # noqa: E402
from gradpress.testing import netns  # noqa: E402
from results import emit as emit_result  # noqa: E402

NUM_WORKERS, NUM_SERVERS = 4, 2
SYSTEMS = ("gp_sparse", "gp_dense", "ddp")
BATCHES = 4
ZIPF_A = 1.1
LR = 0.01


def batches(rank: int, rows: int, batch: int, bag: int):
    """Worker ``rank``'s batches: (ids, offsets, target) each, the ids Zipf-distributed."""
    import numpy as np
    rng = np.random.default_rng(1 + rank)
    out = []
    for _ in range(BATCHES):
        ids = (rng.zipf(ZIPF_A, batch * bag) - 1) % rows
        out.append((ids.astype(np.int64), np.arange(0, batch * bag, bag), rng.standard_normal(batch)))
    return out


def imbalances(rows: int, batch: int, bag: int, steps: range) -> tuple[float, float]:
    import numpy as np
    from gradpress.row_placement import RowLayout, imbalance, range_owners
    received = np.concatenate([np.unique(batches(w, rows, batch, bag)[s % BATCHES][0])
                               for w in range(NUM_WORKERS) for s in steps])
    layout = RowLayout(rows, 1, 0, NUM_SERVERS)  # GRADPRESS_SPARSE_SEED's default
    return (imbalance(layout.owners(received), NUM_SERVERS),
            imbalance(range_owners(received, rows, NUM_SERVERS), NUM_SERVERS))


# ---- one worker ---------------------------------------------------------------------

def train(system: str, a: argparse.Namespace, out: str, ddp_rank: int, ddp_addr: str, ddp_port: int) -> None:
    import torch
    from torch import nn

    class RecModel(nn.Module):
        def __init__(self, sparse: bool):
            super().__init__()
            self.table = nn.EmbeddingBag(a.rows, a.width, mode="mean", sparse=sparse)
            self.mlp = nn.Sequential(nn.Linear(a.width, 128), nn.ReLU(), nn.Linear(128, 1))

        def forward(self, ids, offsets):
            return self.mlp(self.table(ids, offsets)).squeeze(1)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = RecModel(sparse=system == "gp_sparse")
    if system.startswith("gp_"):
        import gradpress.torch as bps
        bps.init()
        rank = bps.rank()
        opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                       named_parameters=model.named_parameters())
        net, finish = model, bps.shutdown
    else:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        dist.init_process_group("gloo", init_method=f"tcp://{ddp_addr}:{ddp_port}", rank=ddp_rank,
                                world_size=NUM_WORKERS)
        rank = ddp_rank
        net = DistributedDataParallel(model)
        opt = torch.optim.SGD(net.parameters(), lr=LR)
        finish = dist.destroy_process_group
    data = [(torch.from_numpy(i), torch.from_numpy(o), torch.from_numpy(y).float())
            for i, o, y in batches(rank, a.rows, a.batch, a.bag)]
    times, losses = [], []
    for step in range(a.warmup + a.iters):
        ids, off, y = data[step % BATCHES]
        t = time.perf_counter()
        opt.zero_grad()
        loss = ((net(ids, off) - y) ** 2).mean()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
    use = resource.getrusage(resource.RUSAGE_SELF)
    with open(out, "w") as fh:
        json.dump({"rank": rank, "times": times[a.warmup:], "warmup_times": times[:a.warmup], "losses": losses,
                   "max_rss_mb": use.ru_maxrss / 1024}, fh)
    finish()


# ---- the driver -------------------------------------------------------------------

def run_once(cluster, system: str, a: argparse.Namespace, port: int, tmp: Path, deadline_s: float) -> list[dict]:
    procs: dict[str, tuple] = {}
    sizes = [str(v) for v in (a.rows, a.width, a.batch, a.bag, a.warmup, a.iters)]
    worker = [sys.executable, str(Path(__file__).resolve()), "_train", system, *sizes]
    try:
        if system.startswith("gp_"):
            common = dict(DMLC_PS_ROOT_URI=cluster.addr("sched"), DMLC_PS_ROOT_PORT=str(port),
                          DMLC_NUM_WORKER=str(NUM_WORKERS), DMLC_NUM_SERVER=str(NUM_SERVERS),
                          GRADPRESS_OP_TIMEOUT_S=str(int(deadline_s)), GRADPRESS_SHM="0")
            if system == "gp_dense":
                common["GRADPRESS_SPARSE_DENSITY"] = "0"
            role = [sys.executable, "-m", "gradpress.launcher"]
            nodes = [("sched", role, dict(DMLC_ROLE="scheduler"))]
            nodes += [(f"s{i}", role, dict(DMLC_ROLE="server")) for i in range(NUM_SERVERS)]
            nodes += [(f"w{i}", worker + [str(tmp / f"{system}_w{i}.json"), "0", "", "0"],
                       dict(DMLC_ROLE="worker", DMLC_WORKER_ID=str(i))) for i in range(NUM_WORKERS)]
            for name, argv, env in nodes:
                env = python_env(**common, **env, DMLC_NODE_HOST=cluster.addr(name))
                procs[name] = (cluster.popen(name, argv, env, tmp / f"{system}_{name}.log", cwd=str(REPO)),
                               tmp / f"{system}_{name}.log")
        else:
            for i in range(NUM_WORKERS):
                argv = worker + [str(tmp / f"{system}_w{i}.json"), str(i), cluster.addr("w0"), str(port)]
                procs[f"w{i}"] = (cluster.popen(f"w{i}", argv, python_env(GLOO_SOCKET_IFNAME="eth0"),
                                                tmp / f"{system}_w{i}.log", cwd=str(REPO)), tmp / f"{system}_w{i}.log")
        wait_for_workers(procs, system, deadline_s)
        return [json.loads((tmp / f"{system}_w{i}.json").read_text()) for i in range(NUM_WORKERS)]
    finally:
        stop_all(procs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--bag", type=int, default=16)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args()
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        p.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    why = netns.check_allowed()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    netns.cleanup_on_signals()
    hashed, ranged = imbalances(a.rows, a.batch, a.bag, range(a.warmup, a.warmup + a.iters))
    print(f"rows received per server, max / mean: hash {hashed:.3f}, contiguous ranges {ranged:.3f}", flush=True)
    result = {"rate": a.rate, "rows": a.rows, "width": a.width, "batch": a.batch, "bag": a.bag,
              "hash_imbalance": round(hashed, 4), "range_imbalance": round(ranged, 4)}
    dense_s = 2 * a.rows * a.width * 4 * 8 / netns.rate_bits(a.rate)
    with netns.NetnsCluster() as cluster, tempfile.TemporaryDirectory(prefix="gp-sparse-") as tmp:
        for name in ["sched"] + [f"s{i}" for i in range(NUM_SERVERS)] + [f"w{i}" for i in range(NUM_WORKERS)]:
            cluster.add_node(name)
        cluster.shape(a.rate)
        for k, system in enumerate(systems):
            try:
                records = run_once(cluster, system, a, 9200 + k, Path(tmp), 180 + 6 * dense_s * (a.warmup + a.iters))
                s = statistics.median(records[0]["times"])
                print(f"{system:10s} {s:8.3f} s/iter  (iterations {[round(t, 3) for t in records[0]['times']]}, "
                      f"loss {records[0]['losses'][0]:.4f} -> {records[0]['losses'][-1]:.4f}, "
                      f"max RSS {records[0]['max_rss_mb']:.0f} MB)", flush=True)
            except RunFailed as e:
                print(f"{system}: FAILED\n{e}", flush=True)
                s = None
            result[f"{system}_s_per_iter"] = s
    for other in ("gp_dense", "ddp"):
        if result.get("gp_sparse_s_per_iter") and result.get(f"{other}_s_per_iter"):
            result[f"speedup_vs_{other}"] = round(result[f"{other}_s_per_iter"] / result["gp_sparse_s_per_iter"], 2)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    emit_result("sparse", result)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_train":
        system, rows, width, batch, bag, warmup, iters, out, rank, addr, port = sys.argv[2:13]
        args = argparse.Namespace(rows=int(rows), width=int(width), batch=int(batch), bag=int(bag),
                                  warmup=int(warmup), iters=int(iters))
        train(system, args, out, int(rank), addr, int(port))
    else:
        sys.exit(main())
