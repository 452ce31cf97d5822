"""``compressor: auto`` on OneBitAdam's momentum path (gradpress/torch/momentum_auto.py):
which options the path takes, and real jobs in which the planner fuses and compresses
the momenta after the freeze."""
import json

import pytest
import torch

from cluster import LocalCluster
from gradpress.compressors.spec import CodecSpec
from gradpress.torch.momentum_path import momentum_codec_problem

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


# 11 steps: the planner's first drift check (its 10th step) would probe the link inside a measured step
STEPS, FREEZE, PLAN_STEPS = 11, 2, 3
WORKER = f"""
import json, os, torch, gradpress.torch as bps
from gradpress.torch import auto_plan
auto_plan.REFINE_STEPS = 10 ** 9  # its broadcast of rank 0's timeline (KBs) would count as a step's pushes
bps.init()
r = bps.rank()
client = bps.ops.client()
def make(label, params):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.ReLU(), torch.nn.Linear(30, 20))
    named = [(f"{{label}}.{{n}}", p) for n, p in model.named_parameters()]
    return model, named, bps.OneBitAdam(model.parameters(), lr=0.01, freeze_step={FREEZE}, named_parameters=named,
                                        compression_params=params)
results = {{"errors": {{}}}}
probe = torch.nn.Linear(3, 3)
for label, make_bad in (("onebit_bad", lambda: bps.OneBitAdam(probe.parameters(),
                                                               compression_params=json.loads(os.environ["GP_BAD"]))),
                        ("zero_one", lambda: bps.ZeroOneAdam(probe.parameters(),
                                                             compression_params={{"compressor": "auto"}}))):
    try:
        make_bad()
        results["errors"][label] = None
    except ValueError as e:
        results["errors"][label] = str(e)
for label, params in json.loads(os.environ["GP_RUNS"]).items():
    model, named, opt = make(label, params)
    losses, pushed = [], []
    for step in range({STEPS}):
        g = torch.Generator().manual_seed(1000 * step + r)
        x = torch.randn(16, 40, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), torch.sin(x[:, :20]))
        loss.backward()
        before = client.bytes_pushed
        opt.step()
        losses.append(loss.item())
        pushed.append(client.bytes_pushed - before)
    planned = opt._planned
    plan = planned.planner.plan if planned is not None else None
    out = {{"state": {{n: p.detach().clone() for n, p in model.named_parameters()}}, "losses": losses,
           "pushed": pushed, "options": plan.options if plan is not None else None}}
    if planned is not None:
        sd = opt.state_dict()
        out["residuals"] = sd["onebit"]["planned_residuals"]
        # a fresh optimizer of the same parameters takes them as its first planned pushes' carry
        _, fresh_named, fresh = make(label, params)
        fresh.load_state_dict(sd)
        carry = fresh._planned.planner.carry
        out["carried"] = {{n: carry[id(fresh._planned.carrier[id(p)])].clone() for n, p in fresh_named
                          if id(fresh._planned.carrier[id(p)]) in carry}}
    results[label] = out
torch.save(results, os.path.join(os.environ["GP_TEST_DIR"], f"w{{r}}.pt"))
bps.shutdown()
"""


@pytest.mark.integ
def test_planned_momentum_equals_the_unplanned_path_and_compresses_when_told(tmp_path):
    runs = {"none": {"compressor": "none"},
            "auto_none": {"compressor": "auto", "allowed": ["none"]},
            "auto_onebit": {"compressor": "auto", "allowed": ["onebit"]}}
    c = LocalCluster(tmp_path, workers=2, servers=1,
                     env={"BYTEPS_MIN_COMPRESS_BYTES": "0", "GRADPRESS_PLAN_STEPS": str(PLAN_STEPS)})
    try:
        bad = {"compressor": "auto", "allowed": ["onebit", SCALED_RANDOMK]}
        c.start(WORKER, worker_env={"GP_RUNS": json.dumps(runs), "GP_BAD": json.dumps(bad)}).assert_success(180)
    finally:
        c.kill()
    a, b = (torch.load(tmp_path / f"w{r}.pt", weights_only=False) for r in range(2))
    errors = a.pop("errors")
    assert errors["onebit_bad"] and "OneBitAdam: compression_params" in errors["onebit_bad"] \
        and "option 'randomk'" in errors["onebit_bad"], errors
    assert errors["zero_one"] and "ZeroOneAdam" in errors["zero_one"] and "'auto' is not available" in \
        errors["zero_one"], errors
    b.pop("errors")
    for label in runs:
        for name in a[label]["state"]:
            assert torch.equal(a[label]["state"][name], b[label]["state"][name]), f"{label}: workers differ at {name}"
    # fused and uncompressed, the planned path sums exactly what the plain one does
    for name, value in a["auto_none"]["state"].items():
        assert torch.equal(value, a["none"]["state"][name]), f"{name}: auto (none only) differs from 'none'"
    assert set(a["auto_none"]["options"]) == {"none"}
    onebit = a["auto_onebit"]
    assert set(onebit["options"]) == {"onebit"}
    raw = 4 * sum(v.numel() for v in onebit["state"].values())
    planned_steps = onebit["pushed"][FREEZE + PLAN_STEPS + 1:]
    assert planned_steps and max(planned_steps) < raw / 8, f"planned momentum pushes {planned_steps}, raw {raw}"
    assert all(torch.isfinite(torch.tensor(onebit["losses"]))) and onebit["losses"][-1] < onebit["losses"][0]
    assert set(onebit["residuals"]) == {f"auto_onebit.{n}" for n in onebit["state"]}, \
        "a parameter's planned residual is not in the checkpoint"
    assert any(float(t.abs().sum()) > 0 for t in onebit["residuals"].values()), "onebit left no residual"
    assert a["auto_none"]["residuals"] == {} and a["auto_none"]["carried"] == {}, "uncompressed, yet residuals"
    for name, saved in onebit["residuals"].items():
        assert torch.equal(onebit["carried"][name], saved.reshape(-1)), f"{name}: the loaded residual differs"
