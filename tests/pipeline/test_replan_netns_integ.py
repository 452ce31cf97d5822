"""Re-planning when the link really changes: a job of ``compressor: auto`` in network
namespaces plans on the unshaped veth link; the test then limits every link to 10 Mbit/s
with ``tc`` while the workers wait at a step boundary. The planner must see its
iterations drift, re-measure the network (a rate near 10 Mbit/s), re-plan on every
worker alike, and hand every residual over: the parameters stay bit-identical to a numpy
replay of each step's plan.
"""
from __future__ import annotations

import json
import secrets
import sys
import time
from pathlib import Path

import pytest
import torch
from netns_job import start_job
from plan_replay import Shape, replay, worker_script

from gradpress.testing import netns

pytestmark = [pytest.mark.integ, pytest.mark.netns]
# 6 x 64 KB of gradients: about 1 ms per step on the bare veth. 10 Mbit/s, not 100: even a plan
# that compresses everything (onebit, 12 KB a step) then drifts clearly off a prediction re-based
# on the fast link (at 100 Mbit/s it could stay within 20% under the two-process suite)
SHAPE = Shape(steps=14, plan_steps=3, layers=6, width=128, lr=0.01)
PAUSE_AFTER_STEP = 4          # once the plan has settled (below); the drift check at step 10 sees 5 slow ones
RATE, RATE_BYTES_PER_S = "10mbit", 10e6 / 8


def _start(cluster: netns.NetnsCluster, tmp: Path) -> dict:
    script = tmp / "worker.py"
    script.write_text(worker_script(SHAPE))
    return start_job(cluster, [sys.executable, str(script)], tmp, {
        "GRADPRESS_JOB_SECRET": secrets.token_hex(32), "GRADPRESS_PLAN_STEPS": str(SHAPE.plan_steps),
        "BYTEPS_MIN_COMPRESS_BYTES": "0", "BYTEPS_PARTITION_BYTES": str(256 << 10),
        "GP_AUTO": json.dumps({"compressor": "auto", "allowed": ["none", "onebit"]}),
        "GP_PAUSE_AFTER_STEP": str(PAUSE_AFTER_STEP),
        # the plan settles after 2 planned steps, with no alternatives to measure first
        "GP_REFINE_STEPS": "1", "GP_TRIALS": "0"})


def _wait(procs: dict, tmp: Path, done, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        failed = {n: p.poll() for n, p in procs.items() if p.poll() not in (None, 0)}
        if failed or time.monotonic() > deadline:
            logs = "\n".join(f"--- {n}\n{(tmp / f'{n}.log').read_text(errors='replace')[-3000:]}" for n in procs)
            raise AssertionError(f"{what}: {failed or 'deadline passed'}\n{logs}")
        time.sleep(0.1)


def test_a_slower_link_mid_run_is_re_measured_and_re_planned_without_losing_a_residual(namespaces, tmp_path):
    procs = _start(namespaces, tmp_path)
    _wait(procs, tmp_path, lambda: all((tmp_path / f"paused{r}").exists() for r in range(2)),
          "workers reaching the pause", 120)
    namespaces.shape(RATE)
    (tmp_path / "go").touch()
    _wait(procs, tmp_path, lambda: all(p.poll() == 0 for p in procs.values()), "the job finishing", 120)

    results = [torch.load(tmp_path / f"w{r}.pt", weights_only=False) for r in range(2)]
    a, b = results
    assert a["version"] >= 1, (f"no re-plan after the link slowed: links measured {a['links']}, plan "
                               f"{a['options']} predicted {a['predicted']:.4f} s")
    first_link, last_link = a["links"][PAUSE_AFTER_STEP], a["links"][-1]
    assert first_link > 10 * RATE_BYTES_PER_S, f"the unshaped link measured {first_link:.3g} B/s"
    # within 0.4-2.5x: the probes are capped at the 256 KB partition (two sizes, 64 KB and 256 KB),
    # and tbf's 5 ms burst lets most of the 64 KB one through at line rate; measured 0.9-2x under
    # the two-process suite, against more than 10x before the link was shaped
    assert 0.4 * RATE_BYTES_PER_S < last_link < 2.5 * RATE_BYTES_PER_S, \
        f"re-measured at {last_link:.3g} B/s, not near {RATE} ({RATE_BYTES_PER_S:.3g} B/s)"
    assert (a["step_groups"], a["links"]) == (b["step_groups"], b["links"]), "workers planned differently"
    for name in a["state"]:
        assert torch.equal(a["state"][name], b["state"][name]), f"{name}: workers' parameters differ"
    want = replay(results, 2, SHAPE)
    for name, value in want.items():
        assert torch.equal(a["state"][name], value), f"{name}: differs from the replay of the plans"
