"""What a message costs a server: many small keys pushed and pulled, with and without engine threads.

    flock /tmp/gp-cpu.lock .venv/bin/python benchmarks/messages.py [--keys 100] [--floats 20000]
        [--steps 40] [--trials 3]

A job of 2 workers and 1 server (``gradpress-launch --local``, loopback TCP: GRADPRESS_SHM=0)
where each step pushes and pulls ``--keys`` tensors of ``--floats`` float32 at once and waits
for them all. The server runs it once with its sums on the I/O thread
(``BYTEPS_SERVER_ENGINE_THREAD=0``, what it chooses by itself on this 2-core machine) and once
with 2 engine threads, alternating, ``--trials`` times each, so that a busy machine slows both.
With engine threads a server still sums keys of at most 64 KiB (``engine.INLINE_MAX_BYTES``)
on its I/O thread: the default 20000 floats (80 KB) are above it, so each is handed over.

Reported per configuration (medians over trials): seconds per step (worker 0's median step),
and the server's CPU per message it receives: the machine's CPU over the timed steps (from
/proc/stat) less both workers' own CPU (getrusage), divided by 2 workers x keys x 2 (a PUSH
and a PULL each). The scheduler's CPU is in that figure too; it only answers heartbeats.
The last line is ``RESULT {json}``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from gradpress.server.engine import INLINE_MAX_BYTES
from results import emit as emit_result

WORKER = """
import json, os, resource, statistics, sys, time, torch, gradpress.torch as bps
bps.init()
keys, floats, steps, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
xs = [torch.randn(floats) for _ in range(keys)]

def step():
    handles = [bps.push_pull_async_inplace(x, average=True, name=f"k{i}") for i, x in enumerate(xs)]
    for h in handles:
        bps.synchronize(h)

def machine_cpu_s():
    ticks = [int(v) for v in open("/proc/stat").readline().split()[1:8]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait

def own_cpu_s():
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime

for _ in range(3):
    step()
times, machine0, own0 = [], machine_cpu_s(), own_cpu_s()
for _ in range(steps):
    t = time.perf_counter()
    step()
    times.append(time.perf_counter() - t)
machine, own = machine_cpu_s() - machine0, own_cpu_s() - own0
with open(f"{out}.{bps.rank()}", "w") as fh:
    json.dump({"step_s": statistics.median(times), "machine_cpu_s": machine, "own_cpu_s": own}, fh)
bps.shutdown()
"""


def run_job(keys: int, floats: int, steps: int, engines: int) -> dict:
    env = dict(os.environ, GRADPRESS_SHM="0", BYTEPS_SERVER_ENGINE_THREAD=str(engines))
    with tempfile.TemporaryDirectory() as tmp:
        script, out = os.path.join(tmp, "w.py"), os.path.join(tmp, "result")
        with open(script, "w") as fh:
            fh.write(WORKER)
        subprocess.run([sys.executable, "-m", "gradpress.launcher", "--local", "--workers", "2", "--servers", "1",
                        "--", sys.executable, script, str(keys), str(floats), str(steps), out],
                       check=True, stdout=subprocess.DEVNULL, env=env, timeout=600)
        ranks = []
        for r in (0, 1):
            with open(f"{out}.{r}") as fh:
                ranks.append(json.load(fh))
    received = 2 * keys * 2 * steps  # each worker: a PUSH and a PULL per key and step
    server_cpu = ranks[0]["machine_cpu_s"] - sum(r["own_cpu_s"] for r in ranks)
    return {"step_s": ranks[0]["step_s"], "server_cpu_us_per_message": 1e6 * server_cpu / received}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=100)
    ap.add_argument("--floats", type=int, default=20000)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    runs: dict[int, list[dict]] = {0: [], 2: []}
    for _ in range(args.trials):
        for engines in runs:
            runs[engines].append(run_job(args.keys, args.floats, args.steps, engines))
    result = {}
    print(f"{args.keys} keys of {args.floats} float32, 2 workers, 1 server, loopback TCP, {args.trials} trials")
    if args.floats * 4 <= INLINE_MAX_BYTES:
        print(f"  (keys of at most {INLINE_MAX_BYTES} bytes: the I/O thread sums them in both configurations)")
    for engines, rs in runs.items():
        step = statistics.median(r["step_s"] for r in rs)
        cpu = statistics.median(r["server_cpu_us_per_message"] for r in rs)
        label = "sums on the I/O thread" if engines == 0 else f"{engines} engine threads"
        steps = ", ".join(f"{1e3 * r['step_s']:.1f}" for r in rs)
        print(f"  {label:24s} {1e3 * step:7.1f} ms/step  {cpu:6.1f} us server CPU per message  (steps {steps})")
        result[f"engines{engines}_step_s"] = round(step, 5)
        result[f"engines{engines}_server_cpu_us_per_message"] = round(cpu, 1)
    result["step_ratio_engines2_over_inline"] = round(result["engines2_step_s"] / result["engines0_step_s"], 3)
    emit_result("messages", result)


if __name__ == "__main__":
    main()
