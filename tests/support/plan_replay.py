"""A job trained with ``compressor: auto`` and its numpy replay, shared by the plan tests.

``worker_script(shape)`` is the workers' script: SGD on a stack of Linear layers, each
worker's data its own, recording every step's fused groups; ``replay`` redoes the same
training in one process, summing each step's gradients the way that step's plan sent them
(onebit with error feedback on both sides, residuals handed over at every re-plan;
fp16_raw's halves summed in float32), so a
job's parameters must equal the replay's bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gradpress.compressors import reference as ref
from gradpress.placement import make_key


@dataclass(frozen=True)
class Shape:
    steps: int = 7
    plan_steps: int = 3
    layers: int = 6
    width: int = 24
    lr: float = 0.05


WORKER = """
import dataclasses, json, os, time, torch, gradpress.torch as bps
from gradpress.torch import ops
from gradpress.pipeline.planning import PlanTuning, planner as planning
tuning = PlanTuning()
# (drift is checked once a plan has settled: re-based after 2 planned steps here)
if os.environ.get("GP_REFINE_STEPS"):
    tuning = dataclasses.replace(tuning, refine_steps=int(os.environ["GP_REFINE_STEPS"]))
if os.environ.get("GP_TRIALS"):  # how many alternatives to measure (besides a low-rank or plain one)
    import gradpress.planner.decide
    gradpress.planner.decide.TRIALS = int(os.environ["GP_TRIALS"])
if os.environ.get("GP_FORCE_REPLAN"):  # every other step counts as drifted and the link as changed
    tuning = dataclasses.replace(tuning, drift=-1.0, drift_steps=1, drift_check_steps=2, link_change=-1.0,
                                 refine_steps=1)
if os.environ.get("GP_FORCE_DRIFT"):  # drifted, but the link is as profiled: the plan must stay
    tuning = dataclasses.replace(tuning, drift=-1.0, drift_steps=1, drift_check_steps=2, link_change=1e9,
                                 refine_steps=1)
if os.environ.get("GP_FORCE_TRIAL"):  # the decision's alternatives: its groups raw, then every tensor apart
    from gradpress.planner.simulate import predict
    real_decide = planning.decide
    def forced(profile, options, min_bytes):
        plan = real_decide(profile, options, min_bytes)
        n = len(profile.tensors)
        apart = tuple((i,) for i in range(n))
        if plan.groups == apart:  # (a loaded host may decide so: the decision fuses, to differ from "apart")
            pairs = tuple(tuple(range(i, min(i + 2, n))) for i in range(0, n, 2))
            plan = dataclasses.replace(plan, groups=pairs, options=plan.options[:1] * len(pairs))
            plan = dataclasses.replace(plan, predicted_s=predict(*plan.simulated(profile)))
        return dataclasses.replace(plan, alternatives=(
            dataclasses.replace(plan, options=("none",) * len(plan.groups)),
            dataclasses.replace(plan, groups=apart, options=plan.options[:1] * len(apart))))
    planning.decide = forced
if os.environ.get("GP_DECIDE_ALTERNATE"):  # the decision: tensors in pairs, the options in turn, no alternative
    from gradpress.planner.decide import Plan
    from gradpress.planner.simulate import predict
    def alternate(profile, options, min_bytes):
        n, names = len(profile.tensors), sorted(options)
        groups = tuple(tuple(range(i, min(i + 2, n))) for i in range(0, n, 2))
        plan = Plan(groups, tuple(names[g % len(names)] for g in range(len(groups))), 0.0, 0.0)
        return dataclasses.replace(plan, predicted_s=predict(*plan.simulated(profile)))
    planning.decide = alternate
if os.environ.get("GP_DECIDE_ONEBIT"):  # the decision: every tensor in one onebit group, no alternative
    from gradpress.planner.decide import Plan
    from gradpress.planner.simulate import predict
    def onebit(profile, options, min_bytes):
        plan = Plan((tuple(range(len(profile.tensors))),), ("onebit",), 0.0, 0.0)
        return dataclasses.replace(plan, predicted_s=predict(*plan.simulated(profile)))
    planning.decide = onebit
slow_trials = float(os.environ.get("GP_SLOW_TRIALS", "0"))  # seconds added to every step a trial measures
pause_at = int(os.environ.get("GP_PAUSE_AFTER_STEP", "-1"))  # the test changes the link meanwhile
test_dir = os.environ["GP_TEST_DIR"]
bps.init()
r = bps.rank()
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear({width}, {width}) for _ in range({layers})])
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr={lr}), named_parameters=model.named_parameters(),
                               compression_params=json.loads(os.environ["GP_AUTO"]), plan_tuning=tuning)
planner = opt._gradpress.planner
g = torch.Generator().manual_seed(100 + r)
planned, step_groups, links, refined, keys = [], [], [], [], {{}}
names = {{id(p): n for n, p in model.named_parameters()}}
def groups_now():  # each group's members, key and option (the plan's: the replay sends it so)
    route = planner.route
    return [([names[id(p)] for p in grp.members], grp.name, None if o == "none" else planner.options[o])
            for grp, o in zip(route.groups, route.plan.options)]
for step in range({steps}):
    x, y = torch.randn(8, {width}, generator=g), torch.randn(8, {width}, generator=g)
    planned.append(opt.gradpress_plan is not None)
    step_groups.append(groups_now() if planned[-1] else None)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    if slow_trials and planner.stage.name == "TRIALS":
        time.sleep(slow_trials)
    opt.step()
    refined.append(planner.refined)
    # every key a step used (a plan left behind is released, so read them while they exist)
    keys.update({{n: [t.tensor_id, t.parts] for n, t in ops.client().tensors.items()}})
    profile = planner.profile
    links.append(profile.link.bytes_per_s if profile is not None else None)
    if step == pause_at:
        open(os.path.join(test_dir, f"paused{{r}}"), "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(test_dir, "go")):
            assert time.monotonic() < deadline, "the test never changed the link"
            time.sleep(0.05)
plan = opt.gradpress_plan
torch.save({{"state": model.state_dict(), "planned": planned, "groups": groups_now(), "step_groups": step_groups,
             "keys": keys, "version": planner.version, "links": links, "refined": refined,
             "options": plan.options, "predicted": plan.predicted_s,
             "host": vars(planner.profile.host) if planner.profile.host else None,
             "reference": planner.reference_s,
             "measured_plans": [(p.groups, p.options, m, t) for p, m, t in planner.measured_plans],
             "declared": sorted(n for n in ops.client().tensors if n.startswith("Plan")),
             "broadcasts": sorted(n for n in ops.client().tensors if n.startswith("Object.Plan"))}},
           os.path.join(test_dir, f"w{{r}}.pt"))
bps.shutdown()
"""


def worker_script(shape: Shape) -> str:
    return WORKER.format(width=shape.width, layers=shape.layers, lr=shape.lr, steps=shape.steps)


def replay(results: list[dict], workers: int, shape: Shape) -> dict:
    """SGD on each worker's gradients (computed again here, one thread, as the workers did),
    summed the way each step's plan sent them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _replay(results, workers, shape)
    finally:
        torch.set_num_threads(threads)


def _replay(results: list[dict], workers: int, shape: Shape) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(shape.width, shape.width) for _ in range(shape.layers)])
    sgd = torch.optim.SGD(model.parameters(), lr=shape.lr)
    params = dict(model.named_parameters())
    data = [torch.Generator().manual_seed(100 + r) for r in range(workers)]
    worker_e, server_e = {}, {}
    carry = [{} for _ in range(workers)]
    first = results[0]
    for step in range(shape.steps):
        grads = []
        for g in data:
            x, y = torch.randn(8, shape.width, generator=g), torch.randn(8, shape.width, generator=g)
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append({n: p.grad.clone() for n, p in params.items()})
        groups = first["step_groups"][step]
        if step and groups is not None and first["step_groups"][step - 1] not in (None, groups):
            _hand_over(first["step_groups"][step - 1], first["keys"], params, worker_e, server_e, carry)
        for r in range(workers):
            for name, extra in carry[r].items():
                grads[r][name] = grads[r][name] + extra.view_as(grads[r][name])
            carry[r] = {}
        if groups is None:
            for name, p in params.items():
                p.grad = (sum(g[name] for g in grads[1:]) + grads[0][name]) / workers
        else:
            for members, group_name, compression in groups:
                flat = [torch.cat([g[n].reshape(-1) for n in members]).numpy() for g in grads]
                out = _group_average(flat, compression, first["keys"][group_name], worker_e, server_e)
                lo = 0
                for n in members:
                    params[n].grad = torch.from_numpy(out[lo:lo + params[n].numel()].copy()).view_as(params[n])
                    lo += params[n].numel()
        with torch.no_grad():
            sgd.step()
    return model.state_dict()


def _hand_over(groups, keys, params, worker_e, server_e, carry) -> None:
    """A re-plan: each compressed group's residuals go to its members' next push (the servers' via rank 0)."""
    for members, group_name, compression in groups:
        if compression is None or compression["compressor"] == "fp16_raw":  # no residuals
            continue
        tensor_id, parts = keys[group_name]
        for r in range(len(carry)):
            flat = np.concatenate([worker_e.get((r, make_key(tensor_id, i)), np.zeros(n, np.float32))
                                   for i, n in enumerate(parts)])
            if r == 0:
                flat = flat + np.concatenate([server_e.get(make_key(tensor_id, i), np.zeros(n, np.float32))
                                              for i, n in enumerate(parts)])
            lo = 0
            for name in members:
                n = params[name].numel()
                carry[r][name] = carry[r].get(name, 0) + torch.from_numpy(flat[lo:lo + n].copy())
                lo += n


def _group_average(flat: list[np.ndarray], compression: dict | None, key_info: list,
                   worker_e: dict, server_e: dict) -> np.ndarray:
    workers = len(flat)
    if compression is None:
        total = flat[0].copy()
        for f in flat[1:]:
            total = total + f
        return total / np.float32(workers)
    if compression["compressor"] == "fp16_raw":
        # halves summed in float32 and rounded once (server or machine owner), the average
        # divided in float32 and rounded to float16, then widened back
        total = flat[0].astype(np.float16).astype(np.float32)
        for f in flat[1:]:
            total = total + f.astype(np.float16).astype(np.float32)
        average = (total.astype(np.float16).astype(np.float32) / np.float32(workers)).astype(np.float16)
        return average.astype(np.float32)
    assert compression["compressor"] == "onebit" and compression["scaling"] is True
    tensor_id, parts = key_info
    out, lo = np.empty(flat[0].size, np.float32), 0
    for i, n in enumerate(parts):
        key = make_key(tensor_id, i)
        acc = None
        for r in range(workers):
            g = flat[r][lo:lo + n]
            e = worker_e.get((r, key))
            p = g if e is None else (g.astype(np.float64) + e.astype(np.float64)).astype(np.float32)
            d = ref.onebit_decode(ref.onebit(p, "l1"), n)
            worker_e[(r, key)] = p - d
            acc = d.copy() if acc is None else acc + d
        e = server_e.get(key)
        s = acc if e is None else (acc.astype(np.float64) + e.astype(np.float64)).astype(np.float32)
        d = ref.onebit_decode(ref.onebit(s, "l1"), n)
        server_e[key] = s - d
        out[lo:lo + n] = d / np.float32(workers)
        lo += n
    return out
