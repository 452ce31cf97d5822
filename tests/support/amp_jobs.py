"""The worker of the loss-scaling job with DistributedOptimizer (``AMP``), on the host
(tests/torch/test_amp_integ.py) or on a GPU (``GP_DEVICE=cuda``, tests/gpu), and what its
two workers' results must show (``check``)."""
import torch
from adam_jobs import PREAMBLE

AMP = """
import os, torch, gradpress.torch as bps
from gradpress.torch import ops
bps.init()
r = bps.rank()
dev = torch.device(os.environ.get("GP_DEVICE", "cpu"))
codec = os.environ.get("GP_CODEC")
params = {"acpsgd": {"compressor": "acpsgd", "rank": 2}, "none": None,
          "onebit": {"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov", "scaling": True}}[codec]
ddp = os.environ.get("GP_WRAP") == "ddp"  # DistributedDataParallel: averages made in backward, a plain step
torch.manual_seed(0)
model = torch.nn.Linear(64, 32).to(dev)   # (a weight worth factoring at rank 2)
if ddp:
    from gradpress.torch.parallel import DistributedDataParallel
    net = DistributedDataParallel(model, compression_params=params)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
else:
    net = model
    opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), compression_params=params)
scaler = torch.amp.GradScaler(dev.type, init_scale=2.0 ** 10)
scales = []
for step in range(6):
    g = torch.Generator().manual_seed(100 * step + r)
    x = torch.randn(8, 64, generator=g).to(dev)
    if step == 2 and r == 1:
        x[0, 0] = float("inf")   # this worker's gradient overflows
    opt.zero_grad()
    scaler.scale(net(x).pow(2).mean()).backward()
    if ddp:  # the standard pattern: backward has averaged every gradient already
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        continue
    opt.synchronize()
    if codec == "onebit":  # every worker's residual and momentum restarted at the skipped round only
        t = ops.client().tensors["Gradient.weight"]
        state = [(t.compressor._momenta.get(k.key), t.compressor.inner.residual(k.key)) for k in t.keys]
        assert all((m is None and e is None) == (step == 2) for m, e in state), (step, r)
        assert torch.isnan(model.weight.grad).all() == (step == 2), (step, r)
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with opt.skip_synchronize():
        scaler.step(opt)
    scaler.update()
    scales.append(scaler.get_scale())
assert all(torch.isfinite(p).all() for p in model.parameters())
saved = {k: v.cpu() for k, v in model.state_dict().items()}
torch.save({"scales": scales, "params": saved}, os.path.join(os.environ["GP_TEST_DIR"], f"amp{r}.pt"))
bps.shutdown()
"""


def check(a: dict, b: dict) -> None:
    """The two workers' saved results: the scales alike, lowered at the overflow (step 2)
    and not after it, and the models equal."""
    assert a["scales"] == b["scales"] and a["scales"][2] < a["scales"][1], a["scales"]
    assert a["scales"][3:] == [a["scales"][2]] * 3, f"the steps after the overflow were skipped too: {a['scales']}"
    for k in a["params"]:
        assert torch.equal(a["params"][k], b["params"][k]), k


# OneBitAdam and ZeroOneAdam driven by a GradScaler (tests/optim/test_amp_adam_integ.py says
# what is checked; ``check_adam`` checks it): worker 1 overflows at iteration WARM of the
# "warm" case and LATE of the "late" one; "omit" never runs iteration WARM
STEPS, FREEZE = 10, 4
WARM, LATE = 1, 6  # iterations: a warm-up/variance step, and a compressed (OneBitAdam) or local (ZeroOneAdam) one

ADAM = PREAMBLE + f"""
STEPS, FREEZE, WARM, LATE = {STEPS}, {FREEZE}, {WARM}, {LATE}
dev = torch.device(os.environ.get("GP_DEVICE", "cpu"))
for opt_name in ("OneBitAdam", "ZeroOneAdam"):
    for case in ("warm", "omit", "late"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(dev)
        named = [(f"{{opt_name}}.{{case}}.{{n}}", p) for n, p in model.named_parameters()]
        opt = build(opt_name, [p for _, p in named], named, FREEZE)
        scaler = torch.amp.GradScaler(dev.type, init_scale=2.0 ** 10)
        changed, params, steps, synced = [], [], [], []
        for it in range(STEPS):
            if case == "omit" and it == WARM:
                continue  # the iteration the "warm" case skips, never run
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * it + r)).to(dev)
            if r == 1 and it == (WARM if case == "warm" else LATE if case == "late" else -1):
                x[0, 0] = float("inf")  # this worker's gradient overflows
            opt.zero_grad()
            scaler.scale(model(x).pow(2).mean()).backward()
            before = [p.detach().clone() for p in model.parameters()]
            scaler.step(opt)
            scaler.update()
            changed.append(any(not torch.equal(b, p) for b, p in zip(before, model.parameters())))
            params.append([p.detach().to("cpu", copy=True) for p in model.parameters()])
            counted = max(st["step"] for st in opt.state.values())
            steps.append(opt.schedule.step if opt_name == "ZeroOneAdam" else counted)
            synced.append(getattr(opt, "in_sync", True))
            assert all(torch.isfinite(p).all() for p in model.parameters()), (opt_name, case, it)
        out[f"{{opt_name}}.{{case}}"] = {{"changed": changed, "params": params, "steps": steps,
                                          "synced": synced, "scale": scaler.get_scale()}}
torch.save(out, os.path.join(os.environ["GP_TEST_DIR"], f"w{{r}}.pt"))
bps.shutdown()
"""


def check_adam(w: list) -> None:
    """The two workers' saved results of ``ADAM``."""
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
