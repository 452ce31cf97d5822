"""compressor 'auto' in a real job (gradpress/pipeline/planning, routes/planned.py): every worker
makes the same plan from rank 0's profile, and the fused groups' results are bit-identical
to a numpy replay of the same grouping (raw, float16 on the wire as `fp16_raw`, and onebit with error
feedback both ways)."""
from __future__ import annotations

import pytest
import torch
from plan_replay import Shape, replay, worker_script

from gradpress.pipeline.planning import PlanTuning

REFINE_STEPS = 3  # re-based after 4 planned steps here (the job's default is longer)

SHAPE = Shape()


@pytest.mark.integ
@pytest.mark.parametrize("auto,force,versions", [({"compressor": "auto", "allowed": ["none", "fp16_raw"]},
                                                  "GP_DECIDE_ALTERNATE", 0),
                                                 ({"compressor": "auto", "allowed": ["onebit"]}, "", 0),
                                                 ({"compressor": "auto", "allowed": ["onebit"]}, "GP_FORCE_REPLAN", 1),
                                                 ({"compressor": "auto", "allowed": ["onebit"]}, "GP_FORCE_DRIFT", 0)],
                         ids=["raw-and-halves", "onebit", "onebit-replanned", "onebit-drift-same-link"])
def test_every_worker_plans_alike_and_fused_sums_match_the_replay(cluster, auto, force, versions):
    import json
    env = {"GP_AUTO": json.dumps(auto), "GRADPRESS_PLAN_STEPS": str(SHAPE.plan_steps), "BYTEPS_MIN_COMPRESS_BYTES": "0"}
    if force:
        env[force] = "1"
    if force == "GP_FORCE_DRIFT":  # no trial (its unfused plan): the drift checks start at once
        env["GP_TRIALS"] = "0"
    c = cluster(workers=2, servers=1, env=env)
    c.start(worker_script(SHAPE)).assert_success(180)
    check_against_replay(c, auto, versions, SHAPE)


@pytest.mark.integ
def test_the_plan_is_re_based_on_the_backward_measured_under_it(cluster):
    """After REFINE_STEPS planned steps the workers re-base the prediction on rank 0's planned
    timeline: alike everywhere, every sum as the replay's."""
    import json
    shape = Shape(steps=SHAPE.plan_steps + REFINE_STEPS + 3)
    auto = {"compressor": "auto", "allowed": ["onebit"]}
    c = cluster(workers=2, servers=1, env={"GP_AUTO": json.dumps(auto), "GRADPRESS_PLAN_STEPS": str(shape.plan_steps),
                                           "BYTEPS_MIN_COMPRESS_BYTES": "0", "GP_REFINE_STEPS": str(REFINE_STEPS),
                                           "GP_TRIALS": "0"})  # no trial: the decision runs at once
    c.start(worker_script(shape)).assert_success(180)
    # (on loopback the drift check at step 10 may also re-probe and re-plan: any count)
    a = check_against_replay(c, auto, None, shape)
    # re-based after its (REFINE_STEPS + 1)th planned step (a later drift re-plan, possible
    # on a loaded loopback, starts the next plan un-based again)
    assert a["refined"][shape.plan_steps + REFINE_STEPS], f"the plan was not re-based: {a['refined']}"
    # who shares rank 0's CPUs, from the address book's machine ids: here every node; the
    # training's CPU measured under the plan (re-based), the same on both workers
    import os
    host = a["host"]
    assert host is not None and host == torch.load(c.tmp / "w1.pt", weights_only=False)["host"]
    assert (host["workers"], host["servers"], host["cores"]) == (2, 1, float(len(os.sched_getaffinity(0)))), host
    assert 0 < host["train_cpu_s"] < 5, host
    # the sockets' CPU per byte, from ZeroMQ's threads over the profiled steps: the data went
    # through shared memory here, so little or nothing, and never near a microsecond a byte
    assert 0 <= host["wire_s_per_byte"] < 1e-6, host


@pytest.mark.integ
def test_the_job_measures_the_alternatives_and_keeps_the_fastest(cluster):
    """The decision's alternatives (forced here: its groups raw, then every tensor apart)
    and then the decision run one after another for as many planned steps each (3 here:
    re-based after 2, the first left out); the job keeps whichever rank 0 measured fastest, every worker alike,
    and every sum across the switches (residuals handed over at each) is the replay's."""
    import json
    per = 3
    shape = Shape(steps=SHAPE.plan_steps + 3 * per + 2)
    auto = {"compressor": "auto", "allowed": ["onebit"]}
    c = cluster(workers=2, servers=1, env={"GP_AUTO": json.dumps(auto), "GRADPRESS_PLAN_STEPS": str(shape.plan_steps),
                                           "BYTEPS_MIN_COMPRESS_BYTES": "0", "GP_FORCE_TRIAL": "1",
                                           "GP_REFINE_STEPS": str(per - 1)})
    c.start(worker_script(shape)).assert_success(180)
    a = check_against_replay(c, auto, None, shape, options={"onebit", "none"})
    b = torch.load(c.tmp / "w1.pt", weights_only=False)
    assert a["measured_plans"] == b["measured_plans"], "workers read different measurements"
    measured = a["measured_plans"]
    assert [set(options) for _, options, _, _ in measured] == [{"none"}, {"onebit"}, {"onebit"}]
    # the decision (fused groups) last, after every tensor apart
    assert len(measured[1][0]) == len(a["state"]) and len(measured[2][0]) < len(a["state"])
    assert measured[0][0] == measured[2][0], "the raw alternative keeps the decision's groups"

    def how(step):  # each group's members and codec, whatever its key is called
        return [(members, compression and compression["compressor"]) for members, _, compression in
                a["step_groups"][step]]
    first = shape.plan_steps
    runs = [how(first + per * k) for k in range(3)]
    for k in range(3):
        steps = range(first + per * k, first + per * (k + 1))
        assert all(how(s) == runs[k] for s in steps), f"plan {k} ran out of turn"
        assert len(runs[k]) == len(measured[k][0])
        assert {codec or "none" for _, codec in runs[k]} == set(measured[k][1])
    # the fastest measured; among plans measured within the noise of it, the fastest modelled
    near = [k for k in range(3) if measured[k][2] <= (1 + PlanTuning().trial_noise) * min(m[2] for m in measured)]
    fastest = min(near, key=lambda k: (measured[k][3], measured[k][2], k))
    settled = first + 3 * per
    assert all(how(s) == runs[fastest] for s in range(settled, shape.steps)), (fastest, measured)
    # drift is then measured against the kept plan's measured time, not its prediction
    assert a["reference"] == b["reference"] == measured[fastest][2]
    assert a["refined"][settled - 1] and not any(a["refined"][:settled - 1])
    # the plans left behind are forgotten (their keys on the servers too: tests/torch/test_pushpull_integ.py)
    assert a["declared"] == sorted(name for _, name, _ in a["groups"]), a["declared"]
    # of the planner's broadcasts (profiles, re-based timelines) only the last one's keys stay
    last = a["broadcasts"][1].rsplit(".", 1)[0]
    assert len(a["broadcasts"]) == 2 and last.startswith("Object.PlanRefined.") and \
        a["broadcasts"][1] == last + ".length" and a["broadcasts"][0].startswith(last + ".data."), a["broadcasts"]


@pytest.mark.integ
@pytest.mark.parametrize("min_bytes", ["0", "400"])
def test_a_plan_measured_slower_than_the_profiled_steps_gives_way_to_them(cluster, min_bytes):
    """Where ``none`` is an option, the profiled steps (uncompressed, as the job sends them
    without a codec) are one more measured candidate: a decision that measures slower than
    they did (by a sleep here; on a GPU, by launches the calibration did not see) is dropped
    for them when the trial ends, on every worker alike, and every sum across the switch (the
    onebit residuals handed over to the raw pushes) is the replay's. With the biases under
    BYTEPS_MIN_COMPRESS_BYTES ("400"), they travel fused while profiling, and so once the
    job goes back to the profiled steps' way."""
    import json
    per = 3
    shape = Shape(steps=SHAPE.plan_steps + per + 3)
    auto = {"compressor": "auto", "allowed": ["onebit", "none"]}
    c = cluster(workers=2, servers=1, env={"GP_AUTO": json.dumps(auto), "GRADPRESS_PLAN_STEPS": str(shape.plan_steps),
                                           "BYTEPS_MIN_COMPRESS_BYTES": min_bytes, "GP_DECIDE_ONEBIT": "1",
                                           "GP_SLOW_TRIALS": "0.3", "GP_REFINE_STEPS": str(per - 1)})
    c.start(worker_script(shape)).assert_success(180)
    a = check_against_replay(c, auto, None, shape, options={"none"})
    b = torch.load(c.tmp / "w1.pt", weights_only=False)
    assert a["measured_plans"] == b["measured_plans"], "workers read different measurements"
    (decided, decided_options, decided_s, _), (profiled, profiled_options, profiled_s, _) = a["measured_plans"]
    assert decided_options == ("onebit",) and len(decided) == 1
    assert set(profiled_options) == {"none"} and sorted(i for g in profiled for i in g) == list(range(len(a["state"])))
    fused = [len(g) for g in profiled if len(g) > 1]
    assert fused == ([] if min_bytes == "0" else [shape.layers]), profiled  # the biases, fused while profiling
    assert decided_s > profiled_s + 0.25, a["measured_plans"]
    settled = shape.plan_steps + per
    assert [len(groups) for groups in a["step_groups"][shape.plan_steps:settled]] == [1] * per
    for step in range(settled, shape.steps):
        groups = a["step_groups"][step]
        assert all(compression is None for _, _, compression in groups) and len(groups) == len(profiled)
        assert sorted(len(members) for members, _, _ in groups) == sorted(len(g) for g in profiled)
        assert all(len(members) == 1 or all(n.endswith(".bias") for n in members) for members, _, _ in groups)
    # drift is measured against the profiled steps' time, which the job now runs as
    assert a["reference"] == b["reference"] == profiled_s
    assert a["refined"][settled - 1] and not any(a["refined"][:settled - 1])


def check_against_replay(c, auto, versions, shape, options=None):
    """Both workers' plans alike and ``versions`` re-plans (None: any), parameters equal to the
    replay, the final plan's options ``options`` (default: every allowed option)."""
    results = [torch.load(c.tmp / f"w{r}.pt", weights_only=False) for r in range(2)]
    a, b = results
    assert a["planned"] == [False] * shape.plan_steps + [True] * (shape.steps - shape.plan_steps)
    # a forced re-plan after step 6 (the plan settled after step 5); a drift on an unchanged link
    # probes but keeps the plan
    if versions is not None:
        assert len({tuple(g[1] for g in groups) for groups in a["step_groups"] if groups}) == versions + 1
    assert (a["groups"], a["options"], a["predicted"]) == (b["groups"], b["options"], b["predicted"]), \
        "workers made different plans"
    expected = set(auto["allowed"])
    assert set(a["options"]) == expected if options is None else set(a["options"]) <= options
    assert sorted(n for members, _, _ in a["groups"] for n in members) == sorted(a["state"]), \
        "a tensor is missing from the plan, or in two groups"
    for name in a["state"]:
        assert torch.equal(a["state"][name], b["state"][name]), f"{name}: workers' parameters differ"
    want = replay(results, 2, shape)  # with the residuals handed over at each re-plan
    for name, value in want.items():
        assert torch.equal(a["state"][name], value), f"{name}: differs from the replay of the plan's grouping"
    return a
