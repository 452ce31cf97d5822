"""``gradpress-plan``: read a saved profile, print the plan and its predicted timeline, and
project it to other job shapes by simulation.

    GRADPRESS_PLAN_FILE=profile.json gradpress-launch ...     # rank 0 saves its profile
    gradpress-plan profile.json                               # the plan the job made
    gradpress-plan profile.json --workers 64 --servers 8 --bandwidth 10gbit
    gradpress-plan profile.json --sweep-workers 8,32,128,512,1024 --sweep-bandwidth 1gbit,10gbit,100gbit

A projection keeps the model's measured timeline and the codecs' measured costs and
changes the job's shape and link rate; it is a prediction, not a measurement.
"""
from __future__ import annotations

import argparse
import json
import re
import sys

from .decide import decide
from .profile import Profile, ProfileError

# bits, as rates are usually written (100mbit, 10gbit, 10Gbps; any case); a capital B alone
# or Bps is bytes (1.25GB, 1.25GBps). (tc reads "bps" as bytes: give B for bytes here.)
_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmg]?)(bits?|bps|b)?$", re.I)


def rate_bytes_per_s(text: str) -> float:
    """``100mbit``, ``10gbit``, ``1.5gbit``, ``1.25GB`` -> bytes per second."""
    m = _RATE.match(text.strip())
    if not m or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rate (e.g. 100mbit, 10gbit, 1.25GB for bytes)")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()]
    return float(m.group(1)) * scale / (1 if (m.group(3) or "") in ("B", "Bps") else 8)


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers")
    return values


def _rates(text: str) -> list[float]:
    values = [rate_bytes_per_s(r) for r in text.split(",") if r.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated rates (e.g. 1gbit,10gbit)")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gradpress-plan", description=__doc__.splitlines()[0])
    p.add_argument("profile", help="a profile saved with GRADPRESS_PLAN_FILE")
    p.add_argument("--workers", type=int, help="project to this many workers")
    p.add_argument("--servers", type=int, help="project to this many servers")
    p.add_argument("--bandwidth", type=rate_bytes_per_s, help="project to this link rate (e.g. 10gbit)")
    p.add_argument("--allowed", default="", help="comma-separated options (default: every option profiled)")
    p.add_argument("--min-compress-bytes", type=int, default=65536)
    p.add_argument("--sweep-workers", type=_ints, help="print predicted s/iter for these worker counts ...")
    p.add_argument("--sweep-bandwidth", type=_rates, help="... and these link rates (comma-separated)")
    p.add_argument("--json", action="store_true", help="print the sweep as JSON")
    args = p.parse_args(argv)
    try:
        profile = Profile.load(args.profile)
        options = [o for o in args.allowed.split(",") if o] or sorted(profile.codecs)
        unknown = sorted(set(options) - set(profile.codecs))
        if unknown:
            p.error(f"--allowed {unknown}: the profile measured only {sorted(profile.codecs)}")
        if args.workers is not None and args.workers < 1 or args.servers is not None and args.servers < 1:
            p.error("--workers and --servers must be at least 1")
        if args.sweep_workers or args.sweep_bandwidth:
            return _sweep(profile, options, args)
        shaped = profile.scaled(args.workers, args.servers, args.bandwidth)
        plan = decide(shaped, options, args.min_compress_bytes)
        print(f"{shaped.workers} worker(s), {shaped.servers} server(s), link {8 * shaped.link.bytes_per_s / 1e9:.3g} "
              f"Gbit/s, latency {1e6 * shaped.link.alpha_s:.0f} us; backward {1e3 * shaped.backward_end_s:.1f} ms, "
              f"step {1e3 * shaped.step_s:.1f} ms")
        print(plan.table(shaped))
    except ProfileError as e:
        print(f"gradpress-plan: {e}", file=sys.stderr)
        return 2
    return 0


def sweep(profile: Profile, options: list[str], workers: list[int], rates: list[float],
          servers: int | None = None, min_compress_bytes: int = 65536) -> list[dict]:
    """Predicted iteration time per (link rate, workers); servers scale with the workers as in
    the profile's job unless ``servers`` is given."""
    rows = []
    for bps in rates:
        for w in workers:
            n_servers = servers or max(1, w * profile.servers // profile.workers)
            plan = decide(profile.scaled(w, n_servers, bps), options, min_compress_bytes)
            rows.append({"workers": w, "servers": n_servers, "gbit_per_s": 8 * bps / 1e9,
                         "predicted_s": plan.predicted_s, "groups": len(plan.groups),
                         "options": {o: plan.options.count(o) for o in sorted(set(plan.options))}})
    return rows


def _sweep(profile: Profile, options: list[str], args) -> int:
    workers = args.sweep_workers or [profile.workers]
    rates = args.sweep_bandwidth or [profile.link.bytes_per_s]
    rows = sweep(profile, options, workers, rates, args.servers, args.min_compress_bytes)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'workers':>8s} {'servers':>8s} {'Gbit/s':>8s} {'s/iter':>9s} {'groups':>7s}  options (groups)")
        for r in rows:
            print(f"{r['workers']:8d} {r['servers']:8d} {r['gbit_per_s']:8.3g} {r['predicted_s']:9.4f} "
                  f"{r['groups']:7d}  {r['options']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
