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
from amp_jobs import ADAM, check_adam

pytestmark = pytest.mark.integ


def test_loss_scaling_skips_alike_on_every_worker_for_both_optimizers(cluster):
    c = cluster(workers=2, servers=1, env={"BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start(ADAM).assert_success(150)
    check_adam([torch.load(c.tmp / f"w{r}.pt") for r in range(2)])
