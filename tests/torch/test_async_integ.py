"""Async mode (BYTEPS_ENABLE_ASYNC=1) as BytePS defines it: the servers hold the
parameters, initialised from rank 0; workers push the change of their local step and
pull the current parameters. A constant gradient gives a known trajectory."""
import json

import pytest

pytestmark = pytest.mark.integ

LR, START, STEPS = 0.5, 10.0, 4

ASYNC = f"""
import json, os, torch, warnings, gradpress.torch as bps
from gradpress.torch import ops
bps.init()
r, n = bps.rank(), bps.size()
w = torch.nn.Parameter(torch.full((3000,), {START} if r == 0 else -7.0))
# worker 1 asks for fp16, as BytePS scripts do (--fp16-pushpull): ignored with a warning, as in BytePS
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    opt = bps.DistributedOptimizer(torch.optim.SGD([w], lr={LR}), named_parameters=[("w", w)],
                                   compression=bps.Compression.fp16 if r == 1 else bps.Compression.none)
ignored = [c for c in caught if "compression is ignored" in str(c.message)]
assert len(ignored) == (1 if r == 1 else 0), [str(c.message) for c in caught]
assert torch.all(w == {START}), "the servers' parameters are rank 0's"
def step():
    opt.zero_grad()
    w.sum().backward()           # a constant gradient of 1
    opt.step()
    assert torch.all(w == w[0]), "one value everywhere"
    return w[0].item()
# workers take turns: each step sees every earlier step of every worker
turns = []
for k in range({STEPS}):
    for turn in range(n):
        if turn == r:
            turns.append(step())
        ops.client().barrier()
# then free-running: each pull sees its own steps and whatever the others pushed so far
free = [step() for _ in range({STEPS})]
ops.client().barrier()
opt.zero_grad()
w.grad = torch.zeros_like(w)     # a zero step: pull the final parameters
opt.step()
try:
    with opt.skip_synchronize():
        pass
    raise SystemExit("skip_synchronize was accepted in async mode")
except AssertionError as e:
    assert "async" in str(e)
with open(os.path.join(os.environ["GP_TEST_DIR"], f"traj{{r}}.json"), "w") as fh:
    json.dump({{"turns": turns, "free": free, "final": w[0].item()}}, fh)
bps.shutdown()
"""


def test_constant_gradient_gives_the_expected_trajectory(cluster):
    n = 2
    c = cluster(workers=n, servers=2, env={"BYTEPS_ENABLE_ASYNC": "1"})
    c.start(ASYNC).assert_success()
    for r in range(n):
        got = json.loads((c.tmp / f"traj{r}.json").read_text())
        # turn k of worker r is step k * n + r + 1 of the whole job
        assert got["turns"] == [START - LR * (k * n + r + 1) for k in range(STEPS)], (r, got)
        applied = [START - v for v in got["free"]]
        done_before = LR * n * STEPS
        for i, a in enumerate(applied):
            own = done_before + LR * (i + 1)
            # its own steps are in every pull; the others' at most all of theirs
            assert own - 1e-9 <= a <= own + LR * (n - 1) * STEPS + 1e-9, (r, i, applied)
        assert applied == sorted(applied), f"worker {r}'s parameters went back: {applied}"
        assert got["final"] == START - LR * 2 * n * STEPS, (r, got["final"])


def test_compression_params_are_refused_in_async_mode(cluster):
    c = cluster(workers=1, servers=1, env={"BYTEPS_ENABLE_ASYNC": "1"})
    c.start("""
import torch, gradpress.torch as bps
bps.init()
w = torch.nn.Parameter(torch.ones(4))
try:
    bps.DistributedOptimizer(torch.optim.SGD([w], lr=0.1), compression_params={"compressor": "onebit"})
    raise SystemExit("compression accepted in async mode")
except ValueError as e:
    assert "BYTEPS_ENABLE_ASYNC" in str(e), e
print("OK refused", flush=True)
bps.shutdown()
""").assert_success()
    assert "OK refused" in c.log("worker 0")


def test_a_parameter_unfrozen_later_starts_from_rank_0s_value_on_the_servers(cluster):
    c = cluster(workers=2, servers=1, env={"BYTEPS_ENABLE_ASYNC": "1"})
    c.start("""
import os, torch, warnings, gradpress.torch as bps
from gradpress.torch import ops
bps.init()
r = bps.rank()
w = torch.nn.Parameter(torch.ones(10))
v = torch.nn.Parameter(torch.full((100,), 5.0 if r == 0 else 3.0), requires_grad=False)
opt = bps.DistributedOptimizer(torch.optim.SGD([w, v], lr=0.5), named_parameters=[("w", w), ("v", v)])
v.requires_grad_(True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    opt.zero_grad()
    (w.sum() + v.sum()).backward()   # both workers at once: the new key's round 0 is everyone's
    opt.step()
assert any("v became trainable" in str(m.message) for m in caught), [str(m.message) for m in caught]
ops.client().barrier()
w.grad, v.grad = torch.zeros_like(w), torch.zeros_like(v)
opt.step()                           # a zero step: pull the final parameters
assert torch.all(v == 5.0 - 2 * 0.5), v[:3]
print(f"OK {v[0].item()}", flush=True)
bps.shutdown()
""").assert_success()
    assert "OK 4.0" in c.log("worker 1")
