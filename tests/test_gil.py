"""A worker's GIL switch interval (gradpress/gil.py, GRADPRESS_GIL_SWITCH_US)."""
import pytest

from gradpress.config import Settings

WORKER = """
import os, sys, torch, gradpress.torch as bps
before = sys.getswitchinterval()
bps.init()
assert torch.equal(bps.push_pull(torch.ones(3), average=False, name="x"), torch.full((3,), 2.0))
with open(os.path.join(os.environ["GP_TEST_DIR"], f"w{bps.rank()}"), "w") as fh:
    fh.write(f"{before!r} {sys.getswitchinterval()!r}")
bps.shutdown()
"""


@pytest.mark.integ
def test_a_worker_takes_the_interval_asked_for_and_leaves_python_s_otherwise(cluster):
    c = cluster(workers=2, servers=1).start(WORKER, each_worker=[{}, {"GRADPRESS_GIL_SWITCH_US": "200"}])
    c.assert_success()
    (b0, a0), (b1, a1) = (map(float, (c.tmp / f"w{r}").read_text().split()) for r in range(2))
    assert a0 == b0 == 0.005  # Python's own, untouched
    assert a1 == pytest.approx(0.0002) and b1 == 0.005


@pytest.mark.parametrize("value", ["-1", "1000001"])
def test_an_interval_out_of_range_is_refused_by_name(value):
    with pytest.raises(ValueError, match="GRADPRESS_GIL_SWITCH_US"):
        Settings.load({"GRADPRESS_GIL_SWITCH_US": value})
