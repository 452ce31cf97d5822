"""The convergence study's arithmetic: run-averaged and post-freeze ratios, and
best_ratio_at_parity (benchmarks/convergence.py), on made-up runs."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import convergence  # noqa: E402


def run(acc: float, loss: float, per_step: float, frozen: float | None = None, d: int = 1000) -> dict:
    r = {"final": {"acc": acc, "loss": loss}, "pushed_per_step": per_step / 2, "pulled_per_step": per_step / 2,
         "params": d, "seconds": 1.0, "identical": True}
    if frozen is not None:
        r["frozen_per_step"] = frozen
    return r


def test_ratios_are_over_the_whole_run_and_after_the_freeze():
    s = convergence.summarise([run(0.9, 2.0, 400.0, frozen=100.0), run(0.8, 3.0, 400.0, frozen=100.0)])
    assert (s["acc"], s["loss"]) == (pytest.approx(0.85), pytest.approx(2.5))
    assert s["ratio_fp16"] == pytest.approx(4 * 1000 / 400), "fp16 pushes and pulls 2 bytes per element each"
    assert s["frozen_ratio_fp16"] == pytest.approx(4 * 1000 / 100)


def test_best_ratio_at_parity_takes_the_largest_ratio_within_both_tolerances():
    bytes_per_step = {"adam": 8000.0, "close": 200.0, "far": 10.0, "lm_only": 100.0}
    digits = {"adam": 0.980, "close": 0.976, "far": 0.960, "lm_only": 0.970}  # within 0.5 points: close
    lm = {"adam": 2.00, "close": 2.05, "far": 2.01, "lm_only": 2.01}  # within 3%: all
    summary = {}
    for name in bytes_per_step:
        summary[("digits", name)] = convergence.summarise([run(digits[name], 0.1, bytes_per_step[name])])
        # the LM sends twice the bytes: a setting's ratio is the smaller of its tasks'
        summary[("lm", name)] = convergence.summarise([run(0.1, lm[name], 2 * bytes_per_step[name])])
    got = convergence.parity(summary, ["digits", "lm"], list(bytes_per_step))
    assert [n for n, v in got["settings"].items() if v["at_parity"]] == ["adam", "close"]
    assert got["best_at_parity"] == "close"
    assert got["best_ratio_at_parity"] == pytest.approx(4 * 1000 / 400)
    assert got["settings"]["far"]["gaps"]["digits"] == pytest.approx(0.02)
    assert convergence.parity(summary, ["digits", "lm"], ["close", "far"]) == {}, "no adam, no parity"
