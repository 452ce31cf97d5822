"""The GPU path checked at ``init()`` (gradpress/torch/cuda_check.py), under numba's CUDA
simulator (the check runs where a GPU is visible or the simulator is on): a broken numba.cuda
(here: its device copy failing as numba-cuda 0.30 fails under numpy 2.5) stops every
process of the job before any step, naming the versions and the fix; a working one lets the
job run."""
import time

import pytest

from cluster import LocalCluster

WORKER = """
import os, torch
if os.environ.get("GP_BREAK") == "1":  # what numba-cuda 0.30.4 does under numpy 2.5.2
    from numba import cuda
    def broken(*args, **kwargs):
        raise AttributeError("module 'numpy' has no attribute 'row_stack'")
    cuda.to_device = broken
import gradpress.torch as bps
bps.init()
open(os.path.join(os.environ["GP_TEST_DIR"], f"stepped{bps.rank()}"), "w").close()
x = torch.ones(8)
bps.push_pull_inplace(x, average=False, name="x")
assert torch.equal(x, torch.full((8,), 2.0)), x
bps.shutdown()
"""


@pytest.mark.integ
def test_a_broken_numba_cuda_stops_the_job_at_init_naming_versions_and_fix(tmp_path):
    c = LocalCluster(tmp_path, workers=2, servers=1, env={"NUMBA_ENABLE_CUDASIM": "1"})
    try:
        start = time.monotonic()
        c.start(WORKER, each_worker=[{"GP_BREAK": "1"}, {"GP_BREAK": "0"}])
        codes = c.wait(timeout_s=90)
        took = time.monotonic() - start
    finally:
        c.kill()
    assert all(code != 0 for code in codes.values()), codes
    assert not list(tmp_path.glob("stepped*")), "a worker got past init()"
    broken = c.log("worker 0")
    for needed in ("GPU path cannot run", "row_stack", "numba-cuda", "numpy<2.5", "torch "):
        assert needed in broken, f"{needed!r} not in worker 0's log:\n{broken}"
    assert "worker 0" in c.log("worker 1") and took < 60, (took, c.logs())


@pytest.mark.integ
def test_a_working_numba_cuda_passes_the_check(tmp_path):
    c = LocalCluster(tmp_path, workers=2, servers=1, env={"NUMBA_ENABLE_CUDASIM": "1"})
    try:
        c.start(WORKER, worker_env={"GP_BREAK": "0"}).assert_success(120)
    finally:
        c.kill()


@pytest.mark.parametrize("initialised, current, contexts, count, local_rank, expected", [
    (False, None, set(), 4, 0, 0), (False, None, set(), 4, 3, 3), (False, None, set(), 2, 3, 1),  # the local rank's
    (False, None, set(), 1, 5, 0),          # CUDA_VISIBLE_DEVICES gave each worker its own one
    (True, 2, {2}, 4, 0, 2),                # torch.cuda.set_device(2) before init(): that one
    (True, 0, {2}, 4, 0, 2),                # model.to("cuda:2") alone before init(): where its context is
    (True, 0, {0, 2}, 4, 1, 0),             # torch works on GPU 0 (and 2): no new context
    (True, 0, set(), 4, 3, 3),              # initialised, no context yet: the local rank's
    (True, 1, None, 4, 0, 1),               # a torch that cannot say: its current GPU
])
def test_the_check_runs_on_the_gpu_the_worker_will_use_not_always_gpu_0(monkeypatch, initialised, current, contexts,
                                                                         count, local_rank, expected):
    import torch

    from gradpress.torch import cuda_check
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialised)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    if contexts is None:
        monkeypatch.delattr(torch._C, "_cuda_hasPrimaryContext", raising=False)
    else:
        monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", lambda d: d in contexts, raising=False)
    assert cuda_check.device_for_check(local_rank) == expected
