"""Convergence of Adam-family training with compressed push/pull, on real data, real processes.

    python benchmarks/convergence.py [--quick] [--tasks digits,lm] [--settings adam,onebit,...]
                                     [--seeds 0,1,2] [--define NAME=JSON]

For each task (digits CNN; byte-level transformer LM on the stdlib's sources, see
``convergence_models.py``) and each setting, a job of 2 workers + 1 server is started with
``gradpress-launch --local``; both workers use the same seed, recipe and number of steps.
Settings (``SETTINGS``): uncompressed Adam; Adam on two-way onebit + error feedback; on
topk 1% + EF; on randomk at about 333x against fp16 + EF; 1-bit Adam (``OneBitAdam``) with
onebit or topk 1% on the momentum; 0/1 Adam (``ZeroOneAdam``) with onebit or topk 1%;
PowerSGD and ACP-SGD at rank 4 with Adam (``powersgd``, ``acpsgd``) and with SGD + momentum
0.9 (``powersgd_sgdm``, ``acpsgd_sgdm``, compared with ``sgdm``, uncompressed); ACP-SGD also
after 10% of the run uncompressed (``acpsgd_warm``, ``acpsgd_sgdm_warm``).

Reported per run: final validation accuracy (digits) or loss (lm), payload bytes on the
wire per step per worker (pushed + pulled, counted by the worker client over the training
steps only) and the compression ratio against fp32 and fp16 (the same parameters pushed
and pulled as 4 or 2 bytes per element), over the whole run (warm-up included) and, for the
settings with a freeze, after it. Charts: ``docs/convergence_<task>.png``, training loss and
the validation metric against steps and against bytes sent. The last line is
``RESULT {json}`` with ``digits_<setting>_acc``, ``lm_<setting>_loss``,
``<setting>_ratio_fp16_run`` (whole run) and ``<setting>_ratio_fp16_frozen`` (after the
freeze), ratios from the digits runs when there are any, everything averaged over seeds;
and ``best_ratio_at_parity``: among the settings within ``PARITY`` of ``adam`` on every task
run (mean of the seeds), the largest run-averaged ratio against fp16, a setting's ratio
being the smallest over its tasks (``best_at_parity`` names it).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

from results import emit as emit_result

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# What a setting sends. "params"/"rules": DistributedOptimizer's compression_params and
# compression_rules (None: uncompressed); "optimizer": "onebit_adam" selects OneBitAdam;
# "env": settings of the job (e.g. BYTEPS_PARTITION_BYTES, the block of a onebit scale).
# "zero_one_adam" selects ZeroOneAdam: "var_freeze" and "local_step_scaler" are fractions of
# the run's steps (so both tasks get the same shape of schedule), the scaler and clipper counts.
# Every compressed setting runs with BYTEPS_MIN_COMPRESS_BYTES=0: the rules alone decide
# what is exempt, so the bytes counted are what the settings say.
SMALL = [("*bias", {"compressor": "none"}), ("*norm*", {"compressor": "none"})]
SGD_LR = 0.05  # SGD with momentum 0.9: the same schedule as Adam's, this peak
SETTINGS = {
    "adam": {"params": None},
    "onebit": {"params": {"compressor": "onebit", "scaling": "l2", "ef": "corrected"}, "rules": SMALL},
    "topk": {"params": {"compressor": "topk", "k": 0.01, "ef": "corrected"}, "rules": SMALL},
    "randomk": {"params": {"compressor": "randomk", "k": 0.0014, "seed": 1, "ef": "corrected"}},
    "onebit_adam": {"optimizer": "onebit_adam", "freeze": 0.25, "eps": 1e-8, "variance_floor": 0.1,
                    "params": {"compressor": "onebit", "scaling": "l2", "ef": "vanilla"}, "rules": SMALL},
    "onebit_adam_topk": {"optimizer": "onebit_adam", "freeze": 0.25, "eps": 1e-8, "variance_floor": 0.1,
                         "params": {"compressor": "topk", "k": 0.01, "ef": "vanilla"}, "rules": SMALL},
    "zero_one_adam": {"optimizer": "zero_one_adam", "var_freeze": 0.1, "var_update_scaler": 4,
                      "local_step_scaler": 0.05, "local_step_clipper": 16, "eps": 1e-8, "variance_floor": 0.1,
                      "variance_params": {"compressor": "fp16"},
                      "params": {"compressor": "onebit", "scaling": "l2", "ef": "vanilla"}, "rules": SMALL},
    "zero_one_adam_topk": {"optimizer": "zero_one_adam", "var_freeze": 0.1, "var_update_scaler": 4,
                           "local_step_scaler": 0.05, "local_step_clipper": 16, "eps": 1e-8, "variance_floor": 0.1,
                           "variance_params": {"compressor": "fp16"},
                           "params": {"compressor": "topk", "k": 0.01, "ef": "vanilla"}, "rules": SMALL},
    # low-rank factors (1-D tensors and matrices below the rate travel uncompressed, fused), with
    # Adam and with SGD + momentum 0.9, each against its own uncompressed optimizer ("baseline")
    "powersgd": {"params": {"compressor": "powersgd", "rank": 4}},
    "acpsgd": {"params": {"compressor": "acpsgd", "rank": 4}},
    # the same after 10% of the run uncompressed ("start": start_step as a fraction of the steps,
    # the warm-up PyTorch's PowerSGD hook has as start_powerSGD_iter)
    "acpsgd_warm": {"params": {"compressor": "acpsgd", "rank": 4}, "start": 0.1},
    "sgdm": {"optimizer": "sgd_momentum", "lr": SGD_LR, "baseline": "sgdm", "params": None},
    "powersgd_sgdm": {"optimizer": "sgd_momentum", "lr": SGD_LR, "baseline": "sgdm",
                      "params": {"compressor": "powersgd", "rank": 4}},
    "acpsgd_sgdm": {"optimizer": "sgd_momentum", "lr": SGD_LR, "baseline": "sgdm",
                    "params": {"compressor": "acpsgd", "rank": 4}},
    "acpsgd_sgdm_warm": {"optimizer": "sgd_momentum", "lr": SGD_LR, "baseline": "sgdm",
                         "params": {"compressor": "acpsgd", "rank": 4}, "start": 0.1},
}
# a setting is at parity with adam within 0.5 points of accuracy (digits) and 3% of validation loss (lm)
PARITY = {"digits": 0.005, "lm": 0.03}
# The same recipe for every setting of a task: Adam, lr with a linear warm-up over
# `warmup` of the steps then cosine decay to 10%; batch per worker.
RECIPES = {
    "digits": {"steps": 600, "batch": 32, "lr": 2e-3, "warmup": 0.05, "eval_every": 25},
    "lm": {"steps": 400, "batch": 16, "lr": 2e-3, "warmup": 0.05, "eval_every": 25},
}
QUICK = {"digits": 150, "lm": 100}


# ---- one worker of one run ------------------------------------------------------------

def lr_factor(step: int, steps: int, warmup: float) -> float:
    w = max(1, int(warmup * steps))
    if step < w:
        return (step + 1) / w
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - w) / max(1, steps - w)))


def run_worker(args) -> None:
    import torch
    import gradpress.torch as bps
    from gradpress.torch import ops
    from convergence_models import TASKS

    torch.set_num_threads(1)
    spec = json.loads(args.spec)
    recipe = json.loads(args.recipe)
    bps.init()
    rank, size = bps.rank(), bps.size()
    task = TASKS[args.task](args.seed)
    torch.manual_seed(args.seed)
    model = task.model()
    named = list(model.named_parameters())
    steps = recipe["steps"]
    rules = [tuple(r) for r in spec.get("rules") or []]
    if spec.get("start") is not None:  # a fraction of the run averaged uncompressed first
        spec["params"] = dict(spec["params"], start_step=max(1, int(spec["start"] * steps)))
    if spec.get("optimizer") == "onebit_adam":
        freeze = max(1, int(spec["freeze"] * steps))
        opt = bps.OneBitAdam(model.parameters(), lr=recipe["lr"], eps=spec["eps"], freeze_step=freeze,
                             compression_params=spec.get("params"), compression_rules=rules,
                             named_parameters=named, variance_floor=spec["variance_floor"])
    elif spec.get("optimizer") == "zero_one_adam":
        freeze = max(1, int(spec["var_freeze"] * steps))
        opt = bps.ZeroOneAdam(model.parameters(), lr=recipe["lr"], eps=spec["eps"], var_freeze_step=freeze,
                              var_update_scaler=spec["var_update_scaler"],
                              local_step_scaler=max(1, int(spec["local_step_scaler"] * steps)),
                              local_step_clipper=spec["local_step_clipper"], compression_params=spec.get("params"),
                              compression_rules=rules, named_parameters=named, variance_floor=spec["variance_floor"],
                              variance_compression_params=spec.get("variance_params"))
    elif spec.get("optimizer") == "sgd_momentum":
        freeze = None
        opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=spec["lr"], momentum=0.9),
                                       named_parameters=named, compression_params=spec.get("params"),
                                       compression_rules=rules)
    else:
        freeze = None
        opt = bps.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=recipe["lr"]),
                                       named_parameters=named, compression_params=spec.get("params"),
                                       compression_rules=rules)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, recipe["warmup"]))
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    client = ops._require()
    start = (client.bytes_pushed, client.bytes_pulled)
    at_freeze = None
    batches = task.batches(rank, size, recipe["batch"], args.seed)
    losses, evals, sent = [], [], []  # sent: bytes pushed + pulled by this worker after each step
    digest, kinds = None, {}
    t0 = time.perf_counter()
    for step in range(steps):
        if freeze is not None and step == freeze:
            at_freeze = (client.bytes_pushed, client.bytes_pulled)
        x, y = next(batches)
        opt.zero_grad()
        loss = task.loss(model, x, y)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        sent.append(client.bytes_pushed + client.bytes_pulled - start[0] - start[1])
        kind = getattr(opt, "last_kind", None) or "step"
        kinds[kind] = kinds.get(kind, 0) + 1
        if getattr(opt, "in_sync", True):  # between 0/1 Adam's syncs workers differ, by design
            digest = (step + 1, float(sum(p.detach().double().sum() * (i + 1)
                                          for i, p in enumerate(model.parameters()))))
        if rank == 0 and ((step + 1) % recipe["eval_every"] == 0 or step + 1 == steps):
            evals.append({"step": step + 1, "sent": sent[-1], **task.evaluate(model)})
    seconds = time.perf_counter() - t0
    end = (client.bytes_pushed, client.bytes_pulled)
    # sanity: every worker held the same parameters after the last step that synchronised them
    digests = [tuple(bps.broadcast_object(digest, root_rank=r, name=f"digest.{r}")) for r in range(size)]
    if rank == 0:
        d = sum(p.numel() for p in model.parameters())
        out = {"task": args.task, "setting": args.setting, "seed": args.seed, "steps": steps,
               "params": d, "seconds": seconds, "train_loss": losses, "evals": evals, "sent": sent,
               "kinds": kinds, "final": evals[-1], "identical": len(set(digests)) == 1, "synced_at": digest[0],
               "pushed_per_step": (end[0] - start[0]) / steps, "pulled_per_step": (end[1] - start[1]) / steps}
        if at_freeze is not None:
            out["frozen_per_step"] = (end[0] - at_freeze[0] + end[1] - at_freeze[1]) / (steps - freeze)
        with open(args.out, "w") as fh:
            json.dump(out, fh)
    bps.shutdown()


# ---- the driver -------------------------------------------------------------------------

def launch(task: str, setting: str, spec: dict, recipe: dict, seed: int, tmp: str) -> dict:
    out = os.path.join(tmp, f"{task}_{setting}_{seed}.json")
    # GRADPRESS_SHM=0: results travel in frames, so the client counts pulled bytes too
    env = dict(os.environ, OMP_NUM_THREADS="1", GRADPRESS_SHM="0", PYTHONPATH=os.pathsep.join([ROOT, HERE]),
               BYTEPS_MIN_COMPRESS_BYTES="0" if spec.get("params") else os.environ.get(
                   "BYTEPS_MIN_COMPRESS_BYTES", "65536"), **spec.get("env", {}))
    cmd = [sys.executable, "-m", "gradpress.launcher", "--local", "--workers", "2", "--servers", "1", "--",
           sys.executable, os.path.abspath(__file__), "--worker", "--task", task, "--setting", setting,
           "--seed", str(seed), "--spec", json.dumps(spec), "--recipe", json.dumps(recipe), "--out", out]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"{task}/{setting} seed {seed} failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    with open(out) as fh:
        return json.load(fh)


def summarise(runs: list[dict]) -> dict:
    """Mean over seeds of the final metrics and the bytes per step (whole run; after the freeze)."""
    first = runs[0]
    wire = sum(r["pushed_per_step"] + r["pulled_per_step"] for r in runs) / len(runs)
    d = first["params"]
    s = {"acc": sum(r["final"]["acc"] for r in runs) / len(runs),
         "loss": sum(r["final"]["loss"] for r in runs) / len(runs),
         "acc_runs": [r["final"]["acc"] for r in runs], "loss_runs": [r["final"]["loss"] for r in runs],
         "bytes": wire, "ratio_fp32": 2 * 4 * d / wire, "ratio_fp16": 2 * 2 * d / wire,
         "seconds": sum(r["seconds"] for r in runs) / len(runs), "kinds": first.get("kinds", {}),
         "identical": all(r["identical"] for r in runs)}
    if "frozen_per_step" in first:
        frozen = sum(r["frozen_per_step"] for r in runs) / len(runs)
        s["frozen_bytes"] = frozen
        s["frozen_ratio_fp16"] = 2 * 2 * d / frozen if frozen else math.inf
    return s


def parity(summary: dict, tasks: list[str], names: list[str], baselines: dict | None = None) -> dict:
    """Each setting's gap to its baseline (``adam`` unless ``baselines`` names another) per task,
    whether it is within ``PARITY`` on all of them,
    and the best run-averaged ratio against fp16 among those that are (a setting's ratio: the
    smallest over its tasks)."""
    if "adam" not in names:
        return {}
    out, best = {}, (None, 0.0)
    for setting in names:
        gaps = {}
        baseline = (baselines or {}).get(setting, "adam")
        if baseline not in names:
            continue
        for t in tasks:
            base, got = summary[(t, baseline)], summary[(t, setting)]
            gaps[t] = base["acc"] - got["acc"] if t == "digits" else got["loss"] / base["loss"] - 1
        ok = all(gaps[t] <= PARITY[t] for t in tasks)
        ratio = min(summary[(t, setting)]["ratio_fp16"] for t in tasks)
        out[setting] = {"gaps": gaps, "at_parity": ok, "ratio_fp16_run": ratio}
        if ok and ratio > best[1]:
            best = (setting, ratio)
    return {"settings": out, "best_at_parity": best[0], "best_ratio_at_parity": best[1]}


def chart(task: str, results: dict, path: str) -> None:
    """Training loss and the validation metric, against steps (left) and bytes sent (right)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    metric = "acc" if task == "digits" else "loss"
    label = "accuracy" if metric == "acc" else "loss"
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    lowest = math.inf
    for setting, runs in results.items():
        losses = runs[0]["train_loss"]
        ema, smooth = losses[0], []
        for v in losses:
            ema = 0.95 * ema + 0.05 * v
            smooth.append(ema)
        sent = [max(b, 1) / 1e6 for b in runs[0]["sent"]]  # MB this worker pushed + pulled so far
        line, = axes[0, 0].plot(range(1, len(smooth) + 1), smooth, label=setting)
        axes[0, 1].plot(sent, smooth, color=line.get_color(), label=setting)
        steps = [e["step"] for e in runs[0]["evals"]]
        values = [sum(r["evals"][i][metric] for r in runs) / len(runs) for i in range(len(steps))]
        lowest = min(lowest, *values)
        axes[1, 0].plot(steps, values, color=line.get_color(), label=setting)
        axes[1, 1].plot([max(e["sent"], 1) / 1e6 for e in runs[0]["evals"]], values, color=line.get_color(),
                        label=setting)
    for ax in axes[0]:
        ax.set(ylabel="training loss (worker 0, EMA 0.95)", yscale="log", title=f"{task}: training loss")
    for ax in axes[1]:
        ax.set(ylabel=f"validation {label} (mean of seeds)", title=f"{task}: validation {label}")
        if metric == "acc":
            ax.set_ylim(0.8, 1.0)
        else:
            ax.set_ylim(0.95 * lowest, min(4.0, ax.get_ylim()[1]))
    for ax in axes[:, 0]:
        ax.set_xlabel("step")
    for ax in axes[:, 1]:
        ax.set(xlabel="MB sent by worker 0 (pushed + pulled, log scale)", xscale="log")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a quarter of the steps, the first seed")
    p.add_argument("--tasks", default="digits,lm")
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds; metrics are averaged")
    p.add_argument("--define", action="append", default=[], metavar="NAME=JSON",
                   help="add or replace a setting, e.g. 'onebit_l1={\"params\": {...}}'")
    p.add_argument("--steps", type=int, help="override every task's steps")
    p.add_argument("--charts", default=os.path.join(ROOT, "docs"), help="folder for the PNGs ('' for none)")
    p.add_argument("--json", help="also write all runs here")
    p.add_argument("--replot", metavar="JSON", help="only draw the charts again from a --json file")
    # worker mode (started by the launcher)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("task", "setting", "spec", "recipe", "out"):
        p.add_argument("--" + name, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return run_worker(args)

    if args.replot:
        with open(args.replot) as fh:
            runs = json.load(fh)["runs"]
        for task in dict.fromkeys(r["task"] for r in runs):
            grouped: dict = {}
            for r in runs:
                if r["task"] == task:
                    grouped.setdefault(r["setting"], []).append(r)
            chart(task, grouped, os.path.join(args.charts, f"convergence_{task}.png"))
        return
    settings = dict(SETTINGS)
    for d in args.define:
        name, _, spec = d.partition("=")
        settings[name] = json.loads(spec)
    names = [s for s in args.settings.split(",") if s]
    unknown = [s for s in names if s not in settings]
    if unknown:
        p.error(f"unknown settings {unknown}; known: {', '.join(settings)}")
    seeds = [int(s) for s in args.seeds.split(",")][:1 if args.quick else None]
    tasks = [t for t in args.tasks.split(",") if t]
    results, summary, everything = {}, {}, []
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="gp-convergence-") as tmp:
        for task in tasks:
            recipe = dict(RECIPES[task])
            if args.quick:
                recipe["steps"] = QUICK[task]
            if args.steps:
                recipe["steps"] = args.steps
            results[task] = {}
            for setting in names:
                runs = [launch(task, setting, settings[setting], recipe, seed, tmp) for seed in seeds]
                results[task][setting] = runs
                everything += runs
                s = summary[(task, setting)] = summarise(runs)
                print(f"{task:6s} {setting:18s} acc {s['acc']:.4f} loss {s['loss']:.4f} "
                      f"bytes/step {s['bytes']:10.0f} x{s['ratio_fp32']:7.1f} fp32 x{s['ratio_fp16']:7.1f} fp16 (run)"
                      + (f" x{s['frozen_ratio_fp16']:.1f} fp16 (after freeze)" if "frozen_ratio_fp16" in s else "")
                      + f"  {s['seconds']:.1f} s/run  {s['kinds']}" + ("" if s["identical"] else "  WORKERS DIFFER"),
                      flush=True)
            if args.charts:
                chart(task, results[task], os.path.join(args.charts, f"convergence_{task}.png"))
    at_parity = parity(summary, tasks, names, {n: settings[n].get("baseline", "adam") for n in names})
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"runs": everything, "summary": {f"{t}_{s}": v for (t, s), v in summary.items()},
                       "parity": at_parity}, fh)
    print("\n| setting | " + " | ".join(f"{t} {'accuracy' if t == 'digits' else 'val loss'}" for t in tasks)
          + " | bytes/step/worker (" + ", ".join(tasks) + ") | ratio vs fp16, run (" + ", ".join(tasks)
          + ") | ratio vs fp16, after freeze | at parity |")
    print("| --- " * (5 + len(tasks)) + "|")
    for setting in names:
        cells = [f"{summary[(t, setting)]['acc' if t == 'digits' else 'loss']:.4f}" for t in tasks]
        wire = ", ".join(f"{summary[(t, setting)]['bytes']:.0f}" for t in tasks)
        run = ", ".join(f"{summary[(t, setting)]['ratio_fp16']:.1f}" for t in tasks)
        frozen = ", ".join(f"{summary[(t, setting)].get('frozen_ratio_fp16', math.nan):.1f}" for t in tasks)
        ok = at_parity.get("settings", {}).get(setting, {}).get("at_parity")
        print(f"| {setting} | " + " | ".join(cells) + f" | {wire} | {run} | {frozen} | "
              + {True: "yes", False: "no", None: "-"}[ok] + " |")
    result = {}
    for setting in names:
        if "digits" in tasks:
            result[f"digits_{setting}_acc"] = round(summary[("digits", setting)]["acc"], 4)
        if "lm" in tasks:
            result[f"lm_{setting}_loss"] = round(summary[("lm", setting)]["loss"], 4)
        ratio_task = "digits" if "digits" in tasks else tasks[0]
        result[f"{setting}_ratio_fp16_run"] = round(summary[(ratio_task, setting)]["ratio_fp16"], 1)
        if "frozen_ratio_fp16" in summary[(ratio_task, setting)]:
            result[f"{setting}_ratio_fp16_frozen"] = round(summary[(ratio_task, setting)]["frozen_ratio_fp16"], 1)
    if at_parity:
        result["best_at_parity"] = at_parity["best_at_parity"]
        result["best_ratio_at_parity"] = round(at_parity["best_ratio_at_parity"], 1)
    print(f"total {time.time() - t_start:.0f} s")
    emit_result("convergence", result)


if __name__ == "__main__":
    main()
