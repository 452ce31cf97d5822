"""A server's encrypted push_pull throughput against its ZeroMQ I/O thread count.

    python benchmarks/curve_threads.py [--workers 8] [--mb 64] [--reps 5] [--threads 1,2,4,8]
        [--partition-bytes N] [--compare-lanes]

With CURVE each connection's frames are encrypted and decrypted on the I/O thread that owns
it, so one server's throughput is capped by the cores its I/O threads get. Here ``--workers``
workers (one connection each to the server) push_pull a float32 tensor of ``--mb`` MB to one
server over loopback TCP (no shared memory), in partitions of ``--partition-bytes`` as a job
sends it, with ``GRADPRESS_IO_THREADS`` set to each count
in turn for the server (each worker keeps ``--worker-threads``: 1, as its one connection
uses one). The server's throughput is what it receives and sends per
second: 2 x workers x tensor bytes over the median seconds of a push_pull (every worker
waits for the slowest). Ratios are against the one-thread figure of the same run. Beside
each count: the cores the whole machine kept busy during the timed push_pulls (/proc/stat),
the workers' own encryption included: where they are all busy, more threads cannot help.

The server listens on one lane per I/O thread (``GRADPRESS_SERVER_LANES``, its default with
CURVE), the workers spread over them by rank. ``--compare-lanes`` also runs every count of
more than one thread with a single endpoint (``GRADPRESS_SERVER_LANES=1``, as before lanes:
libzmq then gives the connections accepted together to whichever threads its stale load
counts name), right after the same count with lanes.

The last line is ``RESULT {json}`` (``results.emit``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from results import child_env, emit

from gradpress.config import Settings

WORKER = """
import json, os, sys, time, numpy as np
from gradpress.config import Settings
from gradpress.worker import WorkerClient
n, reps, out, mine = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
if mine != "same":  # the workers' own count (the server keeps the launcher's)
    os.environ["GRADPRESS_IO_THREADS"] = mine
c = WorkerClient(Settings.load(os.environ))
c.start()
x = np.ones(n, np.float32)
y = np.empty_like(x)
c.push_pull_async("t", x, y, 1, 0).result(600)   # declares the key and warms the path


def cpu_jiffies():  # the whole machine's (busy, total) since boot, from /proc/stat's first line
    fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


times, before = [], cpu_jiffies()
for _ in range(reps):
    c.barrier()
    t = time.perf_counter()
    c.push_pull_async("t", x, y, 1, 0).result(600)
    times.append(time.perf_counter() - t)
after = cpu_jiffies()
assert float(y[0]) == c.size and float(y[-1]) == c.size
if c.rank == 0:
    busy = (after[0] - before[0]) / max(1, after[1] - before[1]) * os.cpu_count()
    with open(out, "w") as fh:
        json.dump({"times": times, "busy_cores": busy}, fh)
c.finish()
"""


def job_seconds(threads: int, workers: int, n: int, reps: int, worker_threads: str, partition_bytes: int,
                lanes: int = -1) -> tuple[float, float]:
    """The median seconds of a push_pull, and the cores the whole machine kept busy meanwhile."""
    env = dict(os.environ, **child_env(), GRADPRESS_SHM="0", GRADPRESS_SECURITY="curve",
               GRADPRESS_IO_THREADS=str(threads), BYTEPS_PARTITION_BYTES=str(partition_bytes),
               GRADPRESS_SERVER_LANES=str(lanes))
    env.pop("GRADPRESS_INSECURE", None)
    with tempfile.TemporaryDirectory() as tmp:
        script, out = os.path.join(tmp, "w.py"), os.path.join(tmp, "times.json")
        with open(script, "w") as fh:
            fh.write(WORKER)
        subprocess.run([sys.executable, "-m", "gradpress.launcher", "--local", "--workers", str(workers),
                        "--servers", "1", "--", sys.executable, script, str(n), str(reps), out,
                        worker_threads],
                       check=True, env=env, timeout=600)
        with open(out) as fh:
            measured = json.load(fh)
        return statistics.median(measured["times"]), measured["busy_cores"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--mb", type=float, default=64.0, help="tensor size in MB (10^6 bytes)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", default="1,2,4,8", help="I/O thread counts, the first is the baseline")
    p.add_argument("--worker-threads", default="1",
                   help="each worker's I/O threads (one connection each: one is all it uses); 'same': the "
                        "server's count, so the workers' idle threads compete for the same cores")
    p.add_argument("--partition-bytes", type=int, default=Settings().partition_bytes,
                   help="BYTEPS_PARTITION_BYTES (default: the job's, BytePS's 4096000); a partition is one "
                        "CURVE message, encrypted and decrypted whole, so the larger it is the less a "
                        "push_pull's four crypto stages (worker, server, server, worker) overlap")
    p.add_argument("--compare-lanes", action="store_true",
                   help="also run each count above 1 with one endpoint (GRADPRESS_SERVER_LANES=1)")
    args = p.parse_args()
    n = int(args.mb * 1e6) // 4
    counts = [int(t) for t in args.threads.split(",")]
    result = {"workers": args.workers, "tensor_MB": args.mb, "cores": os.cpu_count(),
              "worker_io_threads": args.worker_threads, "partition_bytes": args.partition_bytes}
    base = None
    for threads in counts:
        seconds, busy = job_seconds(threads, args.workers, n, args.reps, args.worker_threads,
                                    args.partition_bytes)
        gbps = 2 * args.workers * 4 * n / seconds / 1e9
        base = base or gbps
        result[f"io{threads}_server_GBps"] = round(gbps, 3)
        result[f"io{threads}_over_io{counts[0]}"] = round(gbps / base, 3)
        result[f"io{threads}_busy_cores"] = round(busy, 2)
        print(f"I/O threads {threads:2d}: {seconds:.4f} s per push_pull, server {gbps:.2f} GB/s, "
              f"{gbps / base:.2f}x; {busy:.1f} of {os.cpu_count()} cores busy", flush=True)
        if args.compare_lanes and threads > 1:
            seconds, _ = job_seconds(threads, args.workers, n, args.reps, args.worker_threads,
                                     args.partition_bytes, lanes=1)
            one = 2 * args.workers * 4 * n / seconds / 1e9
            result[f"io{threads}_one_endpoint_server_GBps"] = round(one, 3)
            print(f"  one endpoint: {seconds:.4f} s per push_pull, server {one:.2f} GB/s, {one / base:.2f}x; "
                  f"lanes / one endpoint {gbps / one:.2f}x", flush=True)
    emit("curve_threads", result)


if __name__ == "__main__":
    main()
