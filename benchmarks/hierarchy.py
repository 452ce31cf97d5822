"""One push per machine: gradpress with local reduction on and off, 2 machines x 4 workers, against DDP.

    flock /tmp/gp-cpu.lock .venv/bin/python benchmarks/hierarchy.py [--rate 1gbit] [--models mlp,tfm]
        [--systems gp_none,gp_onebit,gp_auto,ddp] [--iters N] [--warmup N] [--quick] [--json FILE]

Needs root. Each machine is a network namespace (gradpress/testing/netns.py, the harness
``bandwidth.py`` uses) whose one link is shaped by ``tc tbf`` to the rate in both
directions: a scheduler, 2 servers and 2 worker machines, each machine running
``BYTEPS_LOCAL_SIZE=4`` worker processes (``DMLC_WORKER_ID`` its index). Every gradpress
system runs twice: ``local`` (GRADPRESS_LOCAL_REDUCE=1, the default: a machine's workers
sum each partition at its owner, one push per machine, docs/local-reduce.md) and ``flat``
(GRADPRESS_LOCAL_REDUCE=0: every worker pushes its own). ``ddp``: torch DDP (gloo) across
the 8 workers. The training loop is ``bandwidth_worker.py``'s (one fixed batch per worker,
SGD, one thread per worker).

Seconds per iteration: median of worker 0's timed iterations. Machine bytes per step: what
a machine's ``eth0`` sent over its workers' timed iterations (each worker reads the same
counter over its own window: the mean of the machine's 4 readings), per iteration, mean of
the 2 machines. Compute only: the same loop in 8 processes at once with no communication
(this host's cores are shared by all 8), worker 0's median: the floor every system shares.
``--quick``: the MLP, gp_none, gp_onebit and ddp, 1 warm-up and 3 timed iterations (gp_auto
profiles for many steps before it plans: 8 workers on 2 cores make that minutes).

The last line is ``RESULT {json}`` with ``<model>_<system>_<local|flat>_s_per_iter`` and
``<model>_<system>_<local|flat>_machine_MB_per_iter`` (``ddp`` has neither suffix; null where
a run failed) and ``<model>_compute_only_s_per_iter``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import bandwidth_worker  # noqa: E402
from bandwidth import RunFailed, python_env, stop_all, wait_for_workers  # noqa: E402
from bandwidth_models import MODELS  # noqa: E402
from gradpress.testing import netns  # noqa: E402
from results import emit  # noqa: E402

MACHINES, LOCAL, SERVERS = 2, 4, 2
WORKERS = MACHINES * LOCAL
BASE_PORT = 9300
SYSTEMS = ["gp_none", "gp_onebit", "gp_auto", "ddp"]
QUICK_SYSTEMS = ["gp_none", "gp_onebit", "ddp"]


def run_once(cluster: netns.NetnsCluster, model: str, system: str, mode: str, warmup: int, iters: int, port: int,
             tmp: Path, deadline_s: float) -> list[dict]:
    """One job; returns each worker's record (bandwidth_worker's)."""
    tag = f"{model}_{system}_{mode}"
    worker = [sys.executable, str(Path(__file__).resolve()), "_train", system, model, str(warmup), str(iters)]
    procs: dict[str, tuple] = {}
    try:
        if system.startswith("gp_"):
            common = dict(DMLC_PS_ROOT_URI=cluster.addr("sched"), DMLC_PS_ROOT_PORT=str(port),
                          DMLC_NUM_WORKER=str(MACHINES), DMLC_NUM_SERVER=str(SERVERS),
                          GRADPRESS_OP_TIMEOUT_S=str(int(deadline_s)),
                          GRADPRESS_LOCAL_REDUCE="1" if mode == "local" else "0")
            role = [sys.executable, "-m", "gradpress.launcher"]
            nodes = [("sched", "sched", role, dict(DMLC_ROLE="scheduler"))]
            nodes += [(f"s{i}", f"s{i}", role, dict(DMLC_ROLE="server")) for i in range(SERVERS)]
            nodes += [(f"w{r}", f"m{r // LOCAL}", worker + [str(tmp / f"{tag}_w{r}.json"), "0", "", "0"],
                       dict(DMLC_ROLE="worker", DMLC_WORKER_ID=str(r // LOCAL), BYTEPS_LOCAL_RANK=str(r % LOCAL),
                            BYTEPS_LOCAL_SIZE=str(LOCAL))) for r in range(WORKERS)]
            for name, where, argv, env in nodes:
                env = python_env(**common, **env, DMLC_NODE_HOST=cluster.addr(where))
                log = tmp / f"{tag}_{name}.log"
                procs[name] = (cluster.popen(where, argv, env, log, cwd=str(REPO)), log)
        else:
            for r in range(WORKERS):
                argv = worker + [str(tmp / f"{tag}_w{r}.json"), str(r), cluster.addr("m0"), str(port)]
                log = tmp / f"{tag}_w{r}.log"
                procs[f"w{r}"] = (cluster.popen(f"m{r // LOCAL}", argv, python_env(GLOO_SOCKET_IFNAME="eth0"), log,
                                                cwd=str(REPO)), log)
        wait_for_workers(procs, tag, deadline_s)
        import json
        return [json.loads((tmp / f"{tag}_w{r}.json").read_text()) for r in range(WORKERS)]
    finally:
        stop_all(procs)


def machine_mb(recs: list[dict], iters: int) -> float:
    """MB a machine's link sent per iteration, mean of the machines (each: mean of its workers' readings)."""
    by_machine = [[r["tx_bytes"] for r in recs if r["rank"] // LOCAL == m] for m in range(MACHINES)]
    return statistics.mean(statistics.mean(m) for m in by_machine) / iters / 1e6


def compute_only(model: str) -> float:
    """Worker 0's s/iter of the loop in WORKERS processes at once, no communication."""
    procs = [subprocess.Popen([sys.executable, str(HERE / "bandwidth_worker.py"), "_compute", model, "6", "kept"],
                              stdout=subprocess.PIPE, text=True, env=python_env()) for _ in range(WORKERS)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RunFailed(f"compute-only runs failed: {[p.returncode for p in procs]}")
    return float(outs[0].split()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="1gbit", help="every link's rate (a tc rate, or max)")
    p.add_argument("--models", default="mlp,tfm", help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--systems", help=f"comma-separated, of {', '.join(SYSTEMS)} (default all; --quick: "
                                     f"{','.join(QUICK_SYSTEMS)})")
    p.add_argument("--iters", type=int, default=None, help="timed iterations (default 5; --quick 3)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up iterations (default 2; --quick 1)")
    p.add_argument("--quick", action="store_true", help="the MLP; gp_none, gp_onebit, ddp; fewer iterations")
    p.add_argument("--json", help="also write every record to this file")
    args = p.parse_args()
    models = ["mlp"] if args.quick else [m for m in args.models.split(",") if m]
    systems = [s for s in (args.systems or ",".join(QUICK_SYSTEMS if args.quick else SYSTEMS)).split(",") if s]
    unknown = [s for s in systems if s not in SYSTEMS] + [m for m in models if m not in MODELS]
    if unknown:
        p.error(f"unknown {unknown}; systems {SYSTEMS}, models {list(MODELS)}")
    iters = args.iters or (3 if args.quick else 5)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    why = netns.check_allowed()
    if why:
        print(f"hierarchy.py: {why}", file=sys.stderr)
        return 2
    netns.cleanup_on_signals()
    result: dict[str, float | None] = {}
    records: dict[str, list] = {}
    for model in models:
        floor = compute_only(model)
        result[f"{model}_compute_only_s_per_iter"] = floor
        print(f"{model}: compute only, {WORKERS} processes at once on {os.cpu_count()} cores: {floor:.3f} s/iter",
              flush=True)
    port = BASE_PORT
    cluster = netns.NetnsCluster()
    try:
        with cluster, tempfile.TemporaryDirectory(prefix="gp-hierarchy-") as tmpdir:
            for name in ["sched"] + [f"s{i}" for i in range(SERVERS)] + [f"m{m}" for m in range(MACHINES)]:
                cluster.add_node(name)
            cluster.shape(args.rate)
            for model in models:
                per_iter_s = 2 * LOCAL * MODELS[model].params * 4 * 8 / netns.rate_bits(args.rate)
                for system in systems:
                    for mode in (["local", "flat"] if system.startswith("gp_") else [""]):
                        key = f"{model}_{system}" + (f"_{mode}" if mode else "")
                        port += 1
                        deadline_s = 180 + 3 * per_iter_s * (warmup + iters + (70 if system == "gp_auto" else 0))
                        t0 = time.monotonic()
                        try:
                            recs = run_once(cluster, model, system, mode, warmup, iters, port, Path(tmpdir), deadline_s)
                        except RunFailed as e:
                            print(f"{key}: FAILED: {e}", flush=True)
                            result[f"{key}_s_per_iter"] = result[f"{key}_machine_MB_per_iter"] = None
                            continue
                        rec0 = next(r for r in recs if r["rank"] == 0)
                        result[f"{key}_s_per_iter"] = statistics.median(rec0["times"])
                        result[f"{key}_machine_MB_per_iter"] = machine_mb(recs, iters)
                        records[key] = recs
                        print(f"{key}: {result[f'{key}_s_per_iter']:.3f} s/iter, "
                              f"{result[f'{key}_machine_MB_per_iter']:.1f} MB per machine per iter; "
                              f"times {[round(t, 3) for t in rec0['times']]}; {time.monotonic() - t0:.0f} s in all",
                              flush=True)
    except netns.Interrupted as e:
        print(f"hierarchy.py: {e}; namespaces removed", file=sys.stderr)
        return 130
    finally:
        cluster.remove()
    report(result, models, systems)
    if args.json:
        import json
        Path(args.json).write_text(json.dumps({"result": result, "records": records}, indent=1))
    emit("hierarchy", result)
    return 0


def report(result: dict, models: list[str], systems: list[str]) -> None:
    """The issue's goals, as ratios within this run."""
    for model in models:
        floor = result[f"{model}_compute_only_s_per_iter"]
        for system in (s for s in systems if s.startswith("gp_")):
            local, flat = (result.get(f"{model}_{system}_{m}_s_per_iter") for m in ("local", "flat"))
            lmb, fmb = (result.get(f"{model}_{system}_{m}_machine_MB_per_iter") for m in ("local", "flat"))
            if None in (local, flat, lmb, fmb):
                print(f"{model} {system}: a run failed, no ratios")
                continue
            print(f"{model} {system}: machine bytes local/flat {lmb / fmb:.2f} (goal <= 0.3), time local/flat "
                  f"{local / flat:.2f} (goal: gp_none <= 0.5, gp_auto <= 0.6); compute only {floor:.3f} s")
        ddp = result.get(f"{model}_ddp_s_per_iter")
        auto = result.get(f"{model}_gp_auto_local_s_per_iter")
        if ddp is not None and auto is not None:
            print(f"{model}: gp_auto local {auto:.3f} s against DDP {ddp:.3f} s (goal: faster)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_train":
        bandwidth_worker.NUM_WORKERS = WORKERS  # DDP's world and gp_auto's "everyone planned" count every worker
        system, model, warmup, iters, out, ddp_rank, ddp_addr, ddp_port = sys.argv[2:10]
        bandwidth_worker.train(system, model, int(warmup), int(iters), out, int(ddp_rank), ddp_addr,
                               int(ddp_port or 0))
        sys.exit(0)
    sys.exit(main())
