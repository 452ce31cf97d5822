"""``compressor: auto`` on the momentum path of OneBitAdam and ZeroOneAdam (the pipeline's
planned route): which options the path takes, and real jobs in which the planner fuses and
compresses the momenta, and a checkpoint taken under a plan resumes bit for bit."""
import json

import pytest
import torch

from cluster import LocalCluster
from gradpress.compressors.spec import CodecSpec
from gradpress.optim.momentum_codecs import momentum_codec_problem

SCALED_RANDOMK = {"compressor": "randomk", "k": 0.1, "scaling": True, "ef": "vanilla"}


@pytest.mark.parametrize("params", [{"compressor": "auto"}, {"compressor": "auto", "allowed": ["onebit", "none"]},
                                    {"compressor": "auto", "allowed": ["topk", "fp16"]}])
def test_the_momentum_path_takes_auto_with_options_it_can_carry(params):
    CodecSpec.from_params(params)
    assert momentum_codec_problem(params) is None


def test_auto_with_an_option_the_path_cannot_carry_is_refused_naming_it():
    params = {"compressor": "auto", "allowed": ["onebit", SCALED_RANDOMK]}
    CodecSpec.from_params(params)  # valid for gradients: only the momentum path refuses it
    problem = momentum_codec_problem(params)
    assert problem is not None and "option 'randomk' of compressor 'auto'" in problem and "not contractive" in problem


STEPS, FREEZE, PLAN_STEPS, SAVE_AT = 11, 2, 3, 7   # OneBitAdam: planned from step 5 (its 3rd frozen step)
Z_STEPS, Z_SAVE_AT = 12, 8   # ZeroOneAdam (variance at steps 0, 1, 3, 7): planned from its 3rd momentum step
WORKER = f"""
import io, json, os, torch, gradpress.torch as bps
from gradpress.pipeline.planning import PlanTuning
# its broadcast of rank 0's timeline (KBs) would count as a step's pushes, a drift check would
# probe the link inside a measured step: neither within these steps
TUNING = PlanTuning(refine_steps=10 ** 9, drift_check_steps=10 ** 9)
bps.init()
r = bps.rank()
client = bps.ops.client()
def make(label, params, state=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.ReLU(), torch.nn.Linear(30, 20))
    if state is not None:
        model.load_state_dict(state)
    named = [(f"{{label}}.{{n}}", p) for n, p in model.named_parameters()]
    if label.startswith("zero_one"):
        opt = bps.ZeroOneAdam(model.parameters(), lr=0.01, var_update_scaler=1, named_parameters=named,
                              compression_params=params, plan_tuning=TUNING)
    else:
        opt = bps.OneBitAdam(model.parameters(), lr=0.01, freeze_step={FREEZE}, named_parameters=named,
                             compression_params=params, plan_tuning=TUNING)
    return model, opt
def train(model, opt, steps):
    losses, pushed = [], []
    for step in steps:
        g = torch.Generator().manual_seed(1000 * step + r)
        x = torch.randn(16, 40, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), torch.sin(x[:, :20]))
        loss.backward()
        before = client.bytes_pushed
        opt.step()
        losses.append(loss.item())
        pushed.append(client.bytes_pushed - before)
    return losses, pushed
results = {{"errors": {{}}}}
probe = torch.nn.Linear(3, 3)
try:
    bps.OneBitAdam(probe.parameters(), compression_params=json.loads(os.environ["GP_BAD"]))
    results["errors"]["onebit_bad"] = None
except ValueError as e:
    results["errors"]["onebit_bad"] = str(e)
for label, params in json.loads(os.environ["GP_RUNS"]).items():
    steps, save_at = ({Z_STEPS}, {Z_SAVE_AT}) if label.startswith("zero_one") else ({STEPS}, {SAVE_AT})
    model, opt = make(label, params)
    losses, pushed = train(model, opt, range(save_at))
    saved, model_at = io.BytesIO(), {{k: v.clone() for k, v in model.state_dict().items()}}
    torch.save(opt.state_dict(), saved)
    more = train(model, opt, range(save_at, steps))
    losses, pushed = losses + more[0], pushed + more[1]
    planner = opt._momenta.planner
    plan = planner.plan if planner is not None else None
    out = {{"state": {{n: p.detach().clone() for n, p in model.named_parameters()}}, "losses": losses,
           "pushed": pushed, "options": plan.options if plan is not None else None}}
    saved.seek(0)
    sd = torch.load(saved)
    if planner is not None:
        key = "zero_one" if label.startswith("zero_one") else "onebit"
        out["residuals"] = (sd[key]["momentum"] if key == "zero_one" else sd[key])["planned_residuals"]
    # a fresh optimizer of the same parameters, from the checkpoint: it continues the plan in force
    model2, opt2 = make(label, params, model_at)
    opt2.load_state_dict(sd)
    train(model2, opt2, range(save_at, steps))
    out["resumed"] = {{n: p.detach().clone() for n, p in model2.named_parameters()}}
    results[label] = out
torch.save(results, os.path.join(os.environ["GP_TEST_DIR"], f"w{{r}}.pt"))
bps.shutdown()
"""


@pytest.mark.integ
def test_planned_momentum_equals_the_unplanned_path_compresses_when_told_and_resumes_exactly(tmp_path):
    runs = {"none": {"compressor": "none"},
            "auto_none": {"compressor": "auto", "allowed": ["none"]},
            "auto_onebit": {"compressor": "auto", "allowed": ["onebit"]},
            "zero_one_auto": {"compressor": "auto", "allowed": ["onebit"]}}
    c = LocalCluster(tmp_path, workers=2, servers=1,
                     env={"BYTEPS_MIN_COMPRESS_BYTES": "0", "GRADPRESS_PLAN_STEPS": str(PLAN_STEPS)})
    try:
        bad = {"compressor": "auto", "allowed": ["onebit", SCALED_RANDOMK]}
        c.start(WORKER, worker_env={"GP_RUNS": json.dumps(runs), "GP_BAD": json.dumps(bad)}).assert_success(240)
    finally:
        c.kill()
    a, b = (torch.load(tmp_path / f"w{r}.pt", weights_only=False) for r in range(2))
    errors = a.pop("errors")
    assert errors["onebit_bad"] and "OneBitAdam: compression_params" in errors["onebit_bad"] \
        and "option 'randomk'" in errors["onebit_bad"], errors
    b.pop("errors")
    for label in runs:
        for name in a[label]["state"]:
            assert torch.equal(a[label]["state"][name], b[label]["state"][name]), f"{label}: workers differ at {name}"
            assert torch.equal(a[label]["resumed"][name], a[label]["state"][name]), \
                f"{label}: the run resumed from its checkpoint differs at {name}"
    # fused and uncompressed, the planned path sums exactly what the plain one does
    for name, value in a["auto_none"]["state"].items():
        assert torch.equal(value, a["none"]["state"][name]), f"{name}: auto (none only) differs from 'none'"
    assert set(a["auto_none"]["options"]) == {"none"}
    for label in ("auto_onebit", "zero_one_auto"):
        run = a[label]
        assert set(run["options"]) == {"onebit"}, (label, run["options"])
        assert all(torch.isfinite(torch.tensor(run["losses"]))) and run["losses"][-1] < run["losses"][0], label
        assert set(run["residuals"]) == {f"{label}.{n}" for n in run["state"]}, \
            f"{label}: a parameter's planned residual is not in the checkpoint"
        assert any(float(t.abs().sum()) > 0 for t in run["residuals"].values()), f"{label}: onebit left no residual"
    onebit = a["auto_onebit"]
    raw = 4 * sum(v.numel() for v in onebit["state"].values())
    planned_steps = onebit["pushed"][FREEZE + PLAN_STEPS + 1:]
    assert planned_steps and max(planned_steps) < raw / 8, f"planned momentum pushes {planned_steps}, raw {raw}"
    assert a["auto_none"]["residuals"] == {}, "uncompressed, yet residuals"
