"""A rollback in the same job: an optimizer restored from a checkpoint saved before its
first compressed step (OneBitAdam in warm-up) replays the steps after it bit for bit. The
error feedback made since (this worker's and the servers') must not steer the replay. And a
DistributedOptimizer's checkpoint taken after compressed steps holds its codecs' state (both
sides' residuals, the momentum folded into the codec), so that its replay is bit for bit too."""
import pytest

pytestmark = pytest.mark.integ

ROLLBACK = """
import io, torch, gradpress.torch as bps
bps.init()
r = bps.rank()
torch.manual_seed(0)
model = torch.nn.Linear(40, 30)
opt = {make_optimizer}

def train(step):
    g = torch.Generator().manual_seed(1000 * step + r)
    x, y = torch.randn(16, 40, generator=g), torch.randn(16, 30, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
saved, reference = io.BytesIO(), {{}}
for step in range(6):
    if step == {saved_at}:
        torch.save({{"model": model.state_dict(), "opt": opt.state_dict()}}, saved)
    train(step)
    reference[step] = model.weight.detach().clone()
saved.seek(0)
checkpoint = torch.load(saved)
model.load_state_dict(checkpoint["model"])
opt.load_state_dict(checkpoint["opt"])
for step in range({saved_at}, 6):
    train(step)
    assert torch.equal(model.weight, reference[step]), f"step {{step}} replayed otherwise"
print("OK rollback", flush=True)
bps.shutdown()
"""

ONEBIT_ADAM = "bps.OneBitAdam(model.parameters(), lr=0.01, freeze_step=2, named_parameters=model.named_parameters())"
NESTEROV_ONEBIT = ("bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), "
                   "named_parameters=model.named_parameters(), "
                   "compression_params={'compressor': 'onebit', 'ef': 'vanilla', 'momentum': 'nesterov'})")


@pytest.mark.parametrize("make_optimizer,saved_at", [
    (ONEBIT_ADAM, 1),       # still in warm-up: nothing compressed yet
    (NESTEROV_ONEBIT, 3),   # after three compressed steps: residuals and momenta on both sides
], ids=["onebit-adam-before-compressing", "distributed-optimizer-after-compressing"])
def test_a_rollback_replays_the_steps_after_its_checkpoint_bit_for_bit(cluster, make_optimizer, saved_at):
    c = cluster(workers=2, servers=1, env={"BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start(ROLLBACK.format(make_optimizer=make_optimizer, saved_at=saved_at)).assert_success()
    for w in range(2):
        assert "OK rollback" in c.log(f"worker {w}"), c.logs()
