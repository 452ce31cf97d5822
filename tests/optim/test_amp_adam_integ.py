"""OneBitAdam and ZeroOneAdam under ``torch.amp.GradScaler`` (optim/loss_scaling.py), two
real workers: the scaler calls ``step()`` on both, whichever overflowed, and the step skips
alike where an average is not finite.

- An overflow on worker 1 in a step whose gradient travels uncompressed (OneBitAdam's
  warm-up, ZeroOneAdam's variance step) skips that step on both workers, uncounted: the
  run ends with the bits of a run in which that iteration never happened.
- In a compressed momentum step (OneBitAdam after the freeze) the skipped round makes the
  average NaN on both: neither changes its parameters, and they stay equal after.
- In a ZeroOneAdam local step (no communication) worker 1 alone skips its update; the next
  sync makes the workers' parameters equal again, and their schedules never part.
Without this, the scaler skipped ``step()`` on worker 1 alone, whose next step's push_pulls
then paired with the other's current ones."""
import pytest
import torch
from adam_jobs import PREAMBLE

pytestmark = pytest.mark.integ
STEPS, FREEZE = 10, 4
WARM, LATE = 1, 6  # iterations: a warm-up/variance step, and a compressed (OneBitAdam) or local (ZeroOneAdam) one

WORKER = PREAMBLE + f"""
STEPS, FREEZE, WARM, LATE = {STEPS}, {FREEZE}, {WARM}, {LATE}
for opt_name in ("OneBitAdam", "ZeroOneAdam"):
    for case in ("warm", "omit", "late"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        named = [(f"{{opt_name}}.{{case}}.{{n}}", p) for n, p in model.named_parameters()]
        opt = build(opt_name, [p for _, p in named], named, FREEZE)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
        changed, params, steps, synced = [], [], [], []
        for it in range(STEPS):
            if case == "omit" and it == WARM:
                continue  # the iteration the "warm" case skips, never run
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * it + r))
            if r == 1 and it == (WARM if case == "warm" else LATE if case == "late" else -1):
                x[0, 0] = float("inf")  # this worker's gradient overflows
            opt.zero_grad()
            scaler.scale(model(x).pow(2).mean()).backward()
            before = [p.detach().clone() for p in model.parameters()]
            scaler.step(opt)
            scaler.update()
            changed.append(any(not torch.equal(b, p) for b, p in zip(before, model.parameters())))
            params.append([p.detach().clone() for p in model.parameters()])
            counted = max(st["step"] for st in opt.state.values())
            steps.append(opt.schedule.step if opt_name == "ZeroOneAdam" else counted)
            synced.append(getattr(opt, "in_sync", True))
            assert all(torch.isfinite(p).all() for p in model.parameters()), (opt_name, case, it)
        out[f"{{opt_name}}.{{case}}"] = {{"changed": changed, "params": params, "steps": steps,
                                          "synced": synced, "scale": scaler.get_scale()}}
torch.save(out, os.path.join(os.environ["GP_TEST_DIR"], f"w{{r}}.pt"))
bps.shutdown()
"""


def test_loss_scaling_skips_alike_on_every_worker_for_both_optimizers(cluster):
    c = cluster(workers=2, servers=1, env={"BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start(WORKER).assert_success(150)
    w = [torch.load(c.tmp / f"w{r}.pt") for r in range(2)]
    for name in ("OneBitAdam", "ZeroOneAdam"):
        warm, omit, late = (w[0][f"{name}.{case}"] for case in ("warm", "omit", "late"))
        # the overflow step: nothing changed, not counted, on both workers
        for r in range(2):
            run = w[r][f"{name}.warm"]
            assert not run["changed"][WARM] and run["steps"][WARM] == run["steps"][WARM - 1], (name, r, run["steps"])
        assert w[1][f"{name}.warm"]["scale"] < w[0][f"{name}.warm"]["scale"], "worker 1's scaler saw no overflow"
        # and afterwards the bits of a run without that iteration, on each worker (ZeroOneAdam's
        # last step is a local one: the workers differ there), and equal on both where synced
        for r in range(2):
            for a, o in zip(w[r][f"{name}.warm"]["params"][-1], w[r][f"{name}.omit"]["params"][-1]):
                assert torch.equal(a, o), (name, r)
        for a, b in zip(warm["params"][-2], w[1][f"{name}.warm"]["params"][-2]):  # (ZeroOneAdam: a sync)
            assert torch.equal(a, b), name
        assert warm["steps"][-1] == omit["steps"][-1] == STEPS - 1, (warm["steps"], omit["steps"])
        late1 = w[1][f"{name}.late"]
        if name == "OneBitAdam":  # a compressed momentum step: skipped on both, equal after
            assert not late["changed"][LATE] and not late1["changed"][LATE]
            assert late["steps"] == late1["steps"] and late["steps"][LATE] == late["steps"][LATE - 1]
            every = range(STEPS)
        else:  # a local step: worker 1 alone keeps its parameters; the schedule goes on on both
            assert late["changed"][LATE] and not late1["changed"][LATE]
            assert late["steps"] == late1["steps"] == list(range(1, STEPS + 1)), (late["steps"], late1["steps"])
            every = [it for it in range(STEPS) if late["synced"][it]]  # equal again at the sync after it
            assert LATE + 1 in every and LATE not in every, late["synced"]
        for it in every:
            for a, b in zip(late["params"][it], late1["params"][it]):
                assert torch.equal(a, b), (name, it)
