"""Does CrossBarrier save time? Plain DistributedOptimizer against CrossBarrier over 1 Gbit/s.

    flock /tmp/gp-cpu.lock .venv/bin/python benchmarks/cross_barrier.py [--rate 1gbit]
        [--models tfm,mlp] [--reps 2] [--iters 8] [--warmup 2] [--json FILE]

Needs root. The setting of benchmarks/bandwidth.py: every node in a network namespace
of its own (gradpress/testing/netns.py), a scheduler, 2 servers and 2 workers, each
node's link limited to the rate in both directions by ``tc tbf``; the models of
bandwidth_models.py (the transformer LM, 33.6M parameters in 102 tensors, and the MLP,
25.2M in 6), one fixed batch per worker, SGD lr 0.01, one thread per worker.

- ``plain``: ``DistributedOptimizer``: ``step()`` waits for every gradient, then steps.
- ``cross_barrier``: ``CrossBarrier``: ``step()`` returns at once; each parameter is
  stepped as its average lands and the next forward waits layer by layer.

Seconds per iteration: worker 0's wall time from the first timed iteration's start to
the end of the last one (CrossBarrier's last step waits for every update), divided by
the iterations. The systems alternate, ``--reps`` jobs each; the median job is reported.
The last line is ``RESULT {json}`` with ``<model>_<system>_s_per_iter`` and
``<model>_saving_pct`` (positive: CrossBarrier is faster).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

from gradpress.testing import netns  # noqa: E402
from results import emit as emit_result  # noqa: E402

SYSTEMS = ("plain", "cross_barrier")
NUM_WORKERS, NUM_SERVERS, PORT = 2, 2, 9300
LR = 0.01


def train(system: str, model_name: str, warmup: int, iters: int, out: str) -> None:
    """One worker's loop; writes its seconds per timed iteration to ``out``."""
    import torch
    from bandwidth_models import MODELS
    import gradpress.torch as bps
    from gradpress.torch.cross_barrier import CrossBarrier
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = MODELS[model_name]
    model = spec.build()
    bps.init()
    sgd = torch.optim.SGD(model.parameters(), lr=LR)
    if system == "cross_barrier":
        opt = CrossBarrier(model, sgd, named_parameters=model.named_parameters(), num_steps=warmup + iters)
    else:
        opt = bps.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    x, y = spec.batch(torch.Generator().manual_seed(1 + bps.rank()))
    loss_fn = torch.nn.CrossEntropyLoss()
    losses, start = [], 0.0
    for i in range(warmup + iters):
        if i == warmup:
            start = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    seconds = (time.perf_counter() - start) / iters  # the last step() waited for every update
    with open(out, "w") as fh:
        json.dump({"rank": bps.rank(), "s_per_iter": seconds, "losses": losses}, fh)
    bps.shutdown()


def env_for(**extra: str) -> dict:
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
           "PYTHONPATH": f"{REPO}:{HERE}", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           "HOME": os.environ.get("HOME", "/root"), "GRADPRESS_SHM": "0", "GRADPRESS_OP_TIMEOUT_S": "300",
           "DMLC_NUM_WORKER": str(NUM_WORKERS), "DMLC_NUM_SERVER": str(NUM_SERVERS),
           "DMLC_PS_ROOT_PORT": str(PORT)}
    if os.environ.get("NUMBA_CACHE_DIR"):
        env["NUMBA_CACHE_DIR"] = os.environ["NUMBA_CACHE_DIR"]
    env.update(extra)
    return env


def run_job(cluster: netns.NetnsCluster, system: str, model: str, warmup: int, iters: int, tmp: Path,
            tag: str) -> dict:
    procs = {}
    role = [sys.executable, "-m", "gradpress.launcher"]
    nodes = [("sched", role, {"DMLC_ROLE": "scheduler"})]
    nodes += [(f"s{i}", role, {"DMLC_ROLE": "server"}) for i in range(NUM_SERVERS)]
    nodes += [(f"w{i}", [sys.executable, __file__, "_train", system, model, str(warmup), str(iters),
                         str(tmp / f"{tag}_w{i}.json")], {"DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(i)})
              for i in range(NUM_WORKERS)]
    try:
        for name, argv, extra in nodes:
            env = env_for(DMLC_PS_ROOT_URI=cluster.addr("sched"), DMLC_NODE_HOST=cluster.addr(name), **extra)
            procs[name] = cluster.popen(name, argv, env, tmp / f"{tag}_{name}.log", cwd=str(REPO))
        deadline = time.monotonic() + 600
        while any(procs[f"w{i}"].poll() is None for i in range(NUM_WORKERS)):
            failed = [n for n, p in procs.items() if p.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline:
                logs = "\n".join(f"--- {n}\n" + (tmp / f"{tag}_{n}.log").read_text(errors="replace")[-2000:]
                                 for n in procs)
                raise RuntimeError(f"{tag}: {failed or 'deadline passed'}\n{logs}")
            time.sleep(0.2)
        return json.loads((tmp / f"{tag}_w0.json").read_text())
    finally:
        for p in procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 9)
                except ProcessLookupError:
                    pass
            p.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="1gbit", help="every node's link rate (a tc rate, or max)")
    p.add_argument("--models", default="tfm,mlp", help="comma-separated, of tfm, mlp")
    p.add_argument("--reps", type=int, default=2, help="jobs per system and model (they alternate)")
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--json", help="also write every job's record to this file")
    args = p.parse_args()
    why = netns.check_allowed()
    if why:
        print(f"cross_barrier.py: {why}", file=sys.stderr)
        return 2
    netns.cleanup_on_signals()
    results, records = {}, []
    cluster = netns.NetnsCluster()
    with cluster, tempfile.TemporaryDirectory(prefix="gp-crossbarrier-") as tmpdir:
        for name in ["sched"] + [f"s{i}" for i in range(NUM_SERVERS)] + [f"w{i}" for i in range(NUM_WORKERS)]:
            cluster.add_node(name)
        cluster.shape(args.rate)
        for model in args.models.split(","):
            times = {s: [] for s in SYSTEMS}
            for rep in range(args.reps):
                for system in SYSTEMS:
                    rec = run_job(cluster, system, model, args.warmup, args.iters, Path(tmpdir),
                                  f"{model}_{system}_{rep}")
                    times[system].append(rec["s_per_iter"])
                    records.append({"model": model, "system": system, "rep": rep, **rec})
                    print(f"{args.rate} {model} {system} job {rep}: {rec['s_per_iter']:.3f} s/iter", flush=True)
            for system in SYSTEMS:
                results[f"{model}_{system}_s_per_iter"] = statistics.median(times[system])
            plain, cross = results[f"{model}_plain_s_per_iter"], results[f"{model}_cross_barrier_s_per_iter"]
            results[f"{model}_saving_pct"] = 100 * (plain - cross) / plain
            print(f"{args.rate} {model}: plain {plain:.3f} s/iter, CrossBarrier {cross:.3f} s/iter, "
                  f"saving {results[f'{model}_saving_pct']:+.1f}%", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    emit_result("cross_barrier", results)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_train"]:
        train(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    else:
        sys.exit(main())
