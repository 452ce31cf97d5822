"""Mixed precision's loss scaling with DistributedOptimizer, in the pattern byteps-compat.md
shows (Horovod's): synchronize, unscale and clip, then step without a second
synchronize. An overflow on one worker (its gradient inf) reaches every worker's average,
so every GradScaler skips that step and lowers its scale alike, and steps on after it: the
models stay equal. Under a codec with error feedback (and worker momentum), the round
carrying the inf is skipped on every worker: NaN averages, and the key's state restarts."""
import pytest
import torch
from amp_jobs import AMP, check

pytestmark = pytest.mark.integ


@pytest.mark.parametrize("codec,wrap", [("none", "opt"), ("acpsgd", "opt"), ("onebit", "opt"), ("onebit", "ddp")])
def test_loss_scaling_skips_an_overflow_step_on_every_worker_alike(cluster, codec, wrap):
    """acpsgd: the low-rank reducer skips the step alike too (its summed factor is not
    finite on every worker), and the steps after it are finite. ddp: DistributedDataParallel
    with the plain pattern, ``scaler.step(opt)`` after backward."""
    c = cluster(workers=2, servers=1, env={"BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start(AMP, worker_env={"GP_CODEC": codec, "GP_WRAP": wrap}).assert_success()
    check(*(torch.load(c.tmp / f"amp{r}.pt") for r in range(2)))
