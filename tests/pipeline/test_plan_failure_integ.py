"""A planner whose rank 0 fails to make its profile (``auto`` calibrating out of GPU memory,
say) stops every worker with that cause (planning/agreement.py), rather than leaving the
others in the profile's broadcast until the op deadline where rank 0's program caught its
error and went on."""
from __future__ import annotations

import json

import pytest

WORKER = """
import json, os, torch, gradpress.torch as bps
from gradpress.pipeline.planning import planner as planning
bps.init()
r = bps.rank()
if r == 0:
    def failing(*args, **kwargs):
        raise RuntimeError("calibration: CUDA out of memory (the test's)")
    planning.first_profile = failing
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
opt = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                               compression_params={"compressor": "auto"})
caught = None
try:
    for step in range(6):
        opt.zero_grad()
        model(torch.randn(8, 16)).square().mean().backward()
        opt.step()
except Exception as e:  # the program catches it and reports (a training loop that goes on, say)
    caught = {"type": type(e).__name__, "message": str(e), "step": step}
with open(os.path.join(os.environ["GP_TEST_DIR"], f"w{r}.json"), "w") as fh:
    json.dump(caught, fh)
"""


@pytest.mark.integ
def test_rank_0s_failed_profile_stops_every_worker_with_its_cause(cluster):
    # a deadline the old broadcast would have waited out, failing without the cause
    c = cluster(workers=2, servers=1, env={"GRADPRESS_PLAN_STEPS": "2", "GRADPRESS_OP_TIMEOUT_S": "20"})
    c.start(WORKER)
    c.wait(120)
    own, other = (json.loads((c.tmp / f"w{r}.json").read_text()) for r in (0, 1))
    assert own is not None and own["type"] == "RuntimeError" and "(the test's)" in own["message"], (own, c.logs())
    assert other is not None and other["type"] == "JobError", (other, c.logs())
    assert "rank 0 could not make its PlanProfile" in other["message"], other
    assert "RuntimeError: calibration: CUDA out of memory (the test's)" in other["message"], other
    assert own["step"] == other["step"], (own, other)  # at the same step boundary
