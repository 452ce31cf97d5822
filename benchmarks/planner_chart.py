"""The planner's projection of a measured profile to other job shapes, as a chart.

    .venv/bin/python benchmarks/planner_chart.py PROFILE.json [--out docs/planner.png]

For each link rate and worker count (servers as many as workers, as in the profiled job)
it prints the predicted seconds per iteration of the planned job (every option the
profile measured) and of the same job sent uncompressed (fusion only), and draws both.
These are simulations of the profiled model on the profiled machine, not measurements.
The last line is ``RESULT {json}``.
"""
from __future__ import annotations

import argparse

from gradpress.planner.cli import sweep
from gradpress.planner.profile import Profile
from results import emit as emit_result

WORKERS = [2, 8, 32, 128, 512, 1024]
RATES_GBIT = [1, 10, 100]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profile")
    p.add_argument("--out", default="docs/planner.png")
    args = p.parse_args()
    profile = Profile.load(args.profile)
    rates = [g * 1e9 / 8 for g in RATES_GBIT]
    planned = sweep(profile, sorted(profile.codecs), WORKERS, rates)
    raw = sweep(profile, ["none"], WORKERS, rates)
    print(f"{'Gbit/s':>7s} {'workers':>8s} {'planned s':>10s} {'raw s':>9s}  planned options (groups)")
    for a, b in zip(planned, raw):
        print(f"{a['gbit_per_s']:7.3g} {a['workers']:8d} {a['predicted_s']:10.4f} {b['predicted_s']:9.4f}  "
              f"{a['options']}")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for g in RATES_GBIT:
        pts = [r for r in planned if round(r["gbit_per_s"]) == g]
        line, = ax.plot([r["workers"] for r in pts], [r["predicted_s"] for r in pts], marker="o",
                        label=f"{g} Gbit/s, planned")
        pts = [r for r in raw if round(r["gbit_per_s"]) == g]
        ax.plot([r["workers"] for r in pts], [r["predicted_s"] for r in pts], linestyle="--", marker="x",
                color=line.get_color(), label=f"{g} Gbit/s, uncompressed")
    ax.axhline(profile.backward_end_s + profile.step_s, color="black", linestyle=":", linewidth=1,
               label="compute (backward + step)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("workers (servers: as many)")
    ax.set_ylabel("predicted seconds per iteration (log)")
    ax.set_title(f"{len(profile.tensors)} tensors, {sum(t.nbytes for t in profile.tensors) / 1e6:.0f} MB of "
                 f"gradients: the planner's projection", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"chart: {args.out}")
    emit_result("planner_chart", {"planned": planned, "uncompressed": raw})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
