"""Loopback throughput in one run: raw pyzmq, gradpress push_pull, gloo all_reduce.

    python benchmarks/pushpull.py [--mb 100] [--reps 10]
    python benchmarks/pushpull.py --curve-cost [--mb 100] [--reps 10] [--trials 3]

Each figure is bytes of the tensor divided by the median seconds per operation
(push_pull and all_reduce) or per message (zmq). push_pull runs with 2 workers and
1 server started by gradpress-launch --local, through shared memory (the default
for co-located nodes) and again over loopback TCP (GRADPRESS_SHM=0);
all_reduce with 2 gloo processes.
The last line is ``RESULT {json}``.

``--curve-cost`` measures what authentication and encryption cost instead: push_pull
through shared memory and over loopback TCP, each with CURVE (the default, a job
secret made by the launcher) and with ``GRADPRESS_INSECURE=1``; the jobs alternate,
``--trials`` times each, so that a busy machine slows both alike. Its ratio is
insecure throughput / CURVE throughput (above 1: what encryption costs).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from results import emit as emit_result

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- raw ZeroMQ: one process sends 4 MiB messages zero-copy, another receives ----

def _zmq_sink(port: int, count: int) -> None:
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.PULL)
    s.connect(f"tcp://127.0.0.1:{port}")
    for _ in range(count):
        s.recv(copy=False)
    ack = ctx.socket(zmq.PUSH)
    ack.connect(f"tcp://127.0.0.1:{port + 1}")
    ack.send(b"done")
    ack.close(linger=1000)


def zmq_gbps(msg_mb: float = 4.0, total_mb: float = 2000.0, reps: int = 5) -> float:
    import multiprocessing as mp
    import zmq
    buf = np.random.default_rng(0).standard_normal(int(msg_mb * 2**20 / 8)).view(np.uint8)
    count = int(total_mb / msg_mb)
    rates = []
    for _ in range(reps):
        ctx = zmq.Context()
        out = ctx.socket(zmq.PUSH)
        port = out.bind_to_random_port("tcp://127.0.0.1", min_port=20000, max_port=60000)
        ack = ctx.socket(zmq.PULL)
        try:
            ack.bind(f"tcp://127.0.0.1:{port + 1}")
        except zmq.ZMQError:
            out.close()
            ctx.term()
            continue
        sink = mp.get_context("spawn").Process(target=_zmq_sink, args=(port, count))
        sink.start()
        out.send(buf, copy=False)  # first message waits for the connection
        t = time.perf_counter()
        for _ in range(count - 1):
            out.send(buf, copy=False)
        if not ack.poll(120_000):
            raise RuntimeError("zmq sink did not finish")
        ack.recv()
        rates.append((count - 1) * buf.nbytes / (time.perf_counter() - t) / 1e9)
        sink.join()
        out.close()
        ack.close()
        ctx.term()
    return statistics.median(rates)


# ---- gradpress push_pull: a worker script timed inside a local job ----

WORKER = """
import json, os, statistics, sys, time, torch, gradpress.torch as bps
bps.init()
n, reps = int(sys.argv[1]), int(sys.argv[2])
x = torch.randn(n)
for _ in range(2):
    bps.push_pull_inplace(x, average=True, name="bench")
times = []
for _ in range(reps):
    t = time.perf_counter()
    bps.push_pull_inplace(x, average=True, name="bench")
    times.append(time.perf_counter() - t)
if bps.rank() == 0:
    with open(sys.argv[3], "w") as fh:
        json.dump(times, fh)
bps.shutdown()
"""


def pushpull_seconds(nbytes: int, reps: int, shm: bool = True, insecure: bool = False) -> list[float]:
    env = dict(os.environ, GRADPRESS_SHM=str(int(shm)))
    if insecure:  # the job's sockets in the clear: no secret, GRADPRESS_INSECURE=1
        env = {k: v for k, v in env.items() if not k.startswith("GRADPRESS_JOB_SECRET")}
        env["GRADPRESS_INSECURE"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        script, out = os.path.join(tmp, "w.py"), os.path.join(tmp, "times.json")
        with open(script, "w") as fh:
            fh.write(WORKER)
        subprocess.run([sys.executable, "-m", "gradpress.launcher", "--local", "--workers", "2", "--servers", "1",
                        "--", sys.executable, script, str(nbytes // 4), str(reps), out],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL if insecure else None,
                       env=env)
        with open(out) as fh:
            return json.load(fh)


# ---- gloo all_reduce between 2 processes ----

def _gloo_rank(rank: int, port: int, n: int, reps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x = torch.randn(n)
    for _ in range(2):
        dist.all_reduce(x)
    times = []
    for _ in range(reps):
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - t)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(times, fh)
    dist.destroy_process_group()


def gloo_seconds(nbytes: int, reps: int) -> list[float]:
    import torch.multiprocessing as tmp_mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        tmp_mp.spawn(_gloo_rank, args=(port, nbytes // 4, reps, out), nprocs=2, join=True)
        with open(out) as fh:
            return json.load(fh)


def curve_cost(nbytes: int, reps: int, trials: int, mb: float) -> None:
    """push_pull with CURVE and insecure, through shared memory and loopback TCP, alternating."""
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(trials):
        for path in ("shm", "tcp"):
            for security in ("curve", "insecure"):
                times.setdefault((path, security), []).extend(
                    pushpull_seconds(nbytes, reps, shm=path == "shm", insecure=security == "insecure"))
    rate = {k: nbytes / statistics.median(v) / 1e9 for k, v in times.items()}
    print(f"push_pull {mb:g} MB, 2 workers 1 server, {trials} x {reps} timed ops each:")
    print(f"{'path':5s} {'security':9s} {'median s/op':>12s} {'GB/s':>8s}")
    for (path, security), v in times.items():
        print(f"{path:5s} {security:9s} {statistics.median(v):12.4f} {rate[path, security]:8.2f}")
    ratios = {path: rate[path, "insecure"] / rate[path, "curve"] for path in ("shm", "tcp")}
    for path, r in ratios.items():
        print(f"{path}: insecure / CURVE throughput = {r:.3f}")
    emit_result("pushpull-curve-cost", {
        "tensor_MB": mb, **{f"pushpull_{p}_{s}_GBps": round(r, 3) for (p, s), r in rate.items()},
        **{f"{p}_insecure_over_curve": round(r, 3) for p, r in ratios.items()}})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=100.0, help="tensor size in MB (10^6 bytes)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--curve-cost", action="store_true",
                   help="push_pull with and without CURVE (shared memory and TCP) instead of the comparison")
    p.add_argument("--trials", type=int, default=3, help="--curve-cost: jobs per configuration, alternating")
    args = p.parse_args()
    nbytes = int(args.mb * 1e6) // 4 * 4
    if args.curve_cost:
        curve_cost(nbytes, args.reps, args.trials, args.mb)
        return
    zmq_rate = zmq_gbps()
    pp = pushpull_seconds(nbytes, args.reps)
    tcp = pushpull_seconds(nbytes, args.reps, shm=False)
    gl = gloo_seconds(nbytes, args.reps)
    pp_rate, gl_rate = nbytes / statistics.median(pp) / 1e9, nbytes / statistics.median(gl) / 1e9
    tcp_rate = nbytes / statistics.median(tcp) / 1e9
    print(f"{'what':44s} {'median s/op':>12s} {'GB/s':>8s}")
    print(f"{'pyzmq zero-copy, 4 MiB messages, 2 processes':44s} {'':>12s} {zmq_rate:8.2f}")
    label = f"gradpress push_pull {args.mb:g} MB, 2 workers 1 server"
    print(f"{label:44s} {statistics.median(pp):12.4f} {pp_rate:8.2f}")
    print(f"{'  same, GRADPRESS_SHM=0 (loopback TCP)':44s} {statistics.median(tcp):12.4f} {tcp_rate:8.2f}")
    label = f"torch.distributed gloo all_reduce {args.mb:g} MB, 2 procs"
    print(f"{label:44s} {statistics.median(gl):12.4f} {gl_rate:8.2f}")
    print(f"push_pull / gloo: {pp_rate / gl_rate:.2f}x")
    emit_result("pushpull", {"pushpull_GBps": round(pp_rate, 3), "zmq_GBps": round(zmq_rate, 3),
                            "gloo_GBps": round(gl_rate, 3), "pushpull_tcp_GBps": round(tcp_rate, 3),
                            "pushpull_over_gloo": round(pp_rate / gl_rate, 3),
                            "tensor_MB": args.mb})


if __name__ == "__main__":
    main()
