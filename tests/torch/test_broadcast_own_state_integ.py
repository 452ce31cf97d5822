"""``broadcast_optimizer_state`` with gradpress's own optimizer state beside torch's (a
low-rank reducer's step and factors, ZeroOneAdam's schedule): at the start of training
every worker's is the root's and the broadcast goes through; where the root alone loaded a
checkpoint, every worker raises at once, naming what differs, instead of pushing different
tensors and waiting out GRADPRESS_OP_TIMEOUT_S (or drifting apart)."""
import pytest

pytestmark = pytest.mark.integ

OWN_STATE = """
import io, torch, gradpress.torch as bps
bps.init()
r = bps.rank()
for kind in ("acpsgd", "zero_one"):
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 16)
    named = [(f"{kind}.{n}", p) for n, p in model.named_parameters()]
    if kind == "acpsgd":
        opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named,
                                       compression_params={"compressor": "acpsgd", "rank": 2})
    else:
        opt = bps.ZeroOneAdam(model.parameters(), lr=0.01, named_parameters=named, var_freeze_step=2)
    bps.broadcast_optimizer_state(opt, root_rank=0, prefix=f"{kind}.start.")   # all alike: goes through
    saved = io.BytesIO()
    for step in range(3):
        if step == 2:
            torch.save(opt.state_dict(), saved)
        opt.zero_grad()
        model(torch.randn(8, 32)).pow(2).mean().backward()
        opt.step()
    if r == 0:   # the root alone restores the checkpoint, as BytePS's ImageNet example does
        saved.seek(0)
        opt.load_state_dict(torch.load(saved))
    try:
        bps.broadcast_optimizer_state(opt, root_rank=0, prefix=f"{kind}.resume.")
        raise SystemExit(f"{kind}: the broadcast went through with the root's own state apart")
    except ValueError as e:
        assert "differs from the root's (rank 0) on worker(s) [1]" in str(e), e
        assert r == 0 or "step" in str(e) or "schedule" in str(e), e
print("OK own state", flush=True)
bps.shutdown()
"""


def test_a_root_alone_restored_is_refused_on_every_worker(cluster):
    c = cluster(workers=2, servers=1, env={"BYTEPS_MIN_COMPRESS_BYTES": "0", "GRADPRESS_OP_TIMEOUT_S": "60"})
    c.start(OWN_STATE).assert_success(timeout_s=60)
    for w in range(2):
        assert "OK own state" in c.log(f"worker {w}"), c.logs()


OTHER_CLASS = """
import torch, gradpress.torch as bps
bps.init()
model = torch.nn.Linear(4, 2)
opt = (torch.optim.Adam if bps.rank() == 0 else torch.optim.SGD)(model.parameters(), lr=0.1)
model(torch.randn(3, 4)).sum().backward()
opt.step()
bps.broadcast_optimizer_state(opt, root_rank=0)
"""


def test_a_worker_whose_optimizer_class_is_not_the_roots_stops_saying_so(cluster):
    """(Its SGD took the root's Adam state and hyper-parameters, lost its momentum key, and
    failed at its next step with a KeyError.)"""
    c = cluster(workers=2, servers=1, env={"GRADPRESS_OP_TIMEOUT_S": "60"})
    codes = c.start(OTHER_CLASS).wait(timeout_s=60)
    assert codes["worker 1"] != 0 and codes["worker 0"] != 0, codes
    assert "the root's (rank 0) optimizer is Adam, this worker's is SGD" in c.log("worker 1"), c.logs()
