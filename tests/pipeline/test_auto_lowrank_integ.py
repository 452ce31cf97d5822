"""A low-rank option of ``compressor: auto`` in a real job: a plan that factors the
matrices trains bit for bit like ``compressor: acpsgd`` itself (with ``start_step`` equal to
the planner's profiling steps), every worker plans alike, and the matrices' error buffers
are the plan's residuals."""
import json

import pytest
import torch

from cluster import LocalCluster

REFINE_STEPS = 2  # the trial test measures each plan over 3 planned steps (the job's default is longer)

STEPS, PLAN_STEPS = 8, 3
PER_PLAN = REFINE_STEPS + 1  # planned steps each plan runs before the next is tried
TRIAL_STEPS = PLAN_STEPS + 2 * PER_PLAN + 2  # the plan, its alternative, 2 more
ACPSGD = {"compressor": "acpsgd", "rank": 1}
WORKER = f"""
import dataclasses, json, os, torch, gradpress.torch as bps
from gradpress.pipeline.planning import PlanTuning, planner as planning
tuning = PlanTuning()
tuning = dataclasses.replace(tuning, refine_steps=int(os.environ.get("GP_REFINE_STEPS", tuning.refine_steps)))
real_decide = planning.decide
# plan as for a 1 MB/s link, where factoring pays: the job itself runs on loopback
def decide(profile, options, min_bytes):
    plan = real_decide(profile.scaled(bytes_per_s=1e6), options, min_bytes)
    # GP_NO_TRIAL: run the decision at once (the job measures its alternatives before it)
    return dataclasses.replace(plan, alternatives=()) if os.environ.get("GP_NO_TRIAL") else plan
planning.decide = decide
bps.init()
r = bps.rank()
client = bps.ops.client()
results = {{}}
for label, params in json.loads(os.environ["GP_RUNS"]).items():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 40))
    named = list(model.named_parameters())  # one job per run: the names seed the first factors
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=named,
                                   compression_params=params, plan_tuning=tuning)
    planner = opt._gradpress.planner
    g = torch.Generator().manual_seed(10 + r)
    pushed, factored = [], []
    for step in range(int(os.environ.get("GP_STEPS", {STEPS}))):
        x = torch.randn(16, 32, generator=g)
        opt.zero_grad()
        before = client.bytes_pushed  # pushes start during backward
        torch.nn.functional.mse_loss(model(x), torch.sin(x[:, :40].repeat(1, 2)[:, :40])).backward()
        opt.step()
        pushed.append(client.bytes_pushed - before)
        factored.append(len(planner.route.factored if planner.route else []) if planner is not None else None)
    out = {{"state": {{n: p.detach().clone() for n, p in named}}, "pushed": pushed, "factored": factored}}
    if planner is not None:
        names = {{id(p): n for n, p in named}}
        out["plan"] = (planner.plan.groups, planner.plan.options, planner.plan.low_rank,
                       planner.plan.low_rank_option, planner.plan.predicted_s)
        out["matrices"] = sorted(names[id(p)] for p in planner.route.factored)
        out["refined"], out["version"] = planner.refined, planner.version
        out["notes"] = planner.profile.notes
        out["declared"] = sorted(n for n in client.tensors  # plans' groups and factors, link probes
                                 if n.startswith("PlanProbe") or (n.startswith("Plan") and n[4:5].isdigit()))
        out["residuals"] = {{names[i]: t for i, t in planner.residuals().items()}}
    results[label] = out
torch.save(results, os.path.join(os.environ["GP_TEST_DIR"], f"{{label}}{{r}}.pt"))
bps.shutdown()
"""


@pytest.mark.integ
def test_a_factoring_plan_trains_like_acpsgd_itself(tmp_path):
    runs = {"acpsgd": dict(ACPSGD, start_step=PLAN_STEPS),
            "auto": {"compressor": "auto", "allowed": ["none", ACPSGD]}}
    for label, params in runs.items():
        (tmp_path / label).mkdir()
        c = LocalCluster(tmp_path / label, workers=2, servers=2,
                         env={"BYTEPS_MIN_COMPRESS_BYTES": "0", "GRADPRESS_PLAN_STEPS": str(PLAN_STEPS),
                              "GP_RUNS": json.dumps({label: params}), "GP_NO_TRIAL": "1"})
        try:
            c.start(WORKER).assert_success(180)
        finally:
            c.kill()
    a, b = ({label: torch.load(tmp_path / label / f"{label}{r}.pt", weights_only=False)[label] for label in runs}
            for r in range(2))
    auto = a["auto"]
    assert auto["plan"] == b["auto"]["plan"], "workers made different plans"
    assert auto["plan"][3] == "acpsgd" and auto["matrices"] == ["0.weight", "2.weight"], auto["plan"]
    assert set(auto["plan"][1]) == {"none"}, "the biases travel raw"
    for label in runs:
        for name, value in a[label]["state"].items():
            assert torch.equal(value, b[label]["state"][name]), f"{label}: workers differ at {name}"
    for name, value in auto["state"].items():
        assert torch.equal(value, a["acpsgd"]["state"][name]), f"{name}: the planned path differs from acpsgd"
    raw = 4 * sum(v.numel() for v in auto["state"].values())
    # (step PLAN_STEPS - 1 also probes the link)
    pushed = auto["pushed"]
    assert min(pushed[:PLAN_STEPS - 1]) >= raw and max(pushed[PLAN_STEPS + 1:]) < raw / 5, pushed
    # the matrices' error buffers are the plan's residuals (what a re-plan hands over)
    assert sorted(auto["residuals"]) == ["0.weight", "2.weight"]
    for name, residual in auto["residuals"].items():
        assert residual.numel() == auto["state"][name].numel() and float(residual.abs().sum()) > 0, name


@pytest.mark.integ
def test_the_job_tries_the_other_kind_of_plan_and_keeps_the_faster(tmp_path):
    """The decision's alternative (here: everything raw, against the factoring plan) runs for
    as many steps; the job keeps the one rank 0 measured faster, every worker alike."""
    params = {"compressor": "auto", "allowed": ["none", ACPSGD]}
    c = LocalCluster(tmp_path, workers=2, servers=2,
                     env={"BYTEPS_MIN_COMPRESS_BYTES": "0", "GRADPRESS_PLAN_STEPS": str(PLAN_STEPS),
                          "GP_RUNS": json.dumps({"auto": params}), "GP_STEPS": str(TRIAL_STEPS),
                          "GP_REFINE_STEPS": str(REFINE_STEPS)})
    try:
        c.start(WORKER).assert_success(180)
    finally:
        c.kill()
    a, b = (torch.load(tmp_path / f"auto{r}.pt", weights_only=False)["auto"] for r in range(2))
    assert a["refined"] and a["version"] >= 1, (a["refined"], a["version"])
    assert (a["plan"], a["factored"]) == (b["plan"], b["factored"]), "workers settled differently"
    planned = a["factored"][PLAN_STEPS - 1:]  # recorded after each step: the plan of the next one
    # first the raw alternative, then the decision (the factoring plan: a 1 MB/s link, as the
    # decision saw it)
    assert planned[:PER_PLAN] == [0] * PER_PLAN and planned[PER_PLAN:2 * PER_PLAN] == [2] * PER_PLAN, planned
    assert planned[-1] in (0, 2) and planned[-1] == len(a["matrices"])
    # the factoring plan's re-basing took the factor work it measured, and the settled profile
    # carries it whichever plan the job kept
    assert a["notes"]["factor_work_measured_s"] > 0 and a["notes"]["rebuild_measured_s"] > 0, a["notes"]
    # only the kept plan's groups and factors are still declared: the others (and the link
    # probes) were released
    assert a["declared"] and all(n.startswith(f"Plan{a['version']}.") for n in a["declared"]), a["declared"]
    for name, value in a["state"].items():
        assert torch.equal(value, b["state"][name]), f"{name}: workers differ"
