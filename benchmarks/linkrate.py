"""How fast a veth link between two network namespaces carries one bulk TCP stream.

    flock /tmp/gp-cpu.lock .venv/bin/python benchmarks/linkrate.py [--rates max,10gbit,1gbit]
        [--seconds 3] [--runs 3]

Needs root. Two nodes on the bridge of ``gradpress/testing/netns.py``; for each rate
(``max``: no tc qdisc at all, the veth as it is) a receiver in one namespace and a
sender in the other move data for ``--seconds`` through one TCP connection, 4 MiB
``sendall`` calls, the way a large ZeroMQ frame goes. The figure is the bytes the
receiver counted over its own clock, median of ``--runs``. This is what
``benchmarks/bandwidth.py`` calls the fastest rate: the most a link sustains here
before the CPU, not tc, is the limit. The last line is ``RESULT {json}`` with
``<rate>_Gbit_s``.
"""
from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from gradpress.testing import netns  # noqa: E402
from results import emit as emit_result  # noqa: E402

PORT = 9300
CHUNK = 4 << 20


def receive(port: int) -> None:
    """Count bytes until the sender closes; print Gbit/s from first byte to last."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    print("listening", flush=True)
    conn, _ = srv.accept()
    buf = bytearray(CHUNK)
    total, start, last = 0, None, None
    while True:
        n = conn.recv_into(buf)
        if n == 0:
            break
        now = time.perf_counter()
        start = start or now
        total += n
        last = now
    print(total * 8 / (last - start) / 1e9 if total and last > start else 0.0, flush=True)


def send(host: str, port: int, seconds: float) -> None:
    data = memoryview(bytearray(CHUNK))
    end = time.monotonic() + 10
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        conn.sendall(data)
    conn.close()


def one_run(cluster: netns.NetnsCluster, port: int, seconds: float) -> float:
    here = [sys.executable, str(Path(__file__).resolve())]
    rx = subprocess.Popen(["ip", "netns", "exec", cluster.ns("b"), *here, "_recv", str(port)],
                          stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == "listening"
        subprocess.run(["ip", "netns", "exec", cluster.ns("a"), *here, "_send", cluster.addr("b"), str(port),
                        str(seconds)], check=True, timeout=seconds + 60)
        out, _ = rx.communicate(timeout=60)
        return float(out.split()[-1])
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="max,10gbit", help="comma-separated: max (unshaped) or a tc rate")
    p.add_argument("--seconds", type=float, default=3.0, help="length of one transfer")
    p.add_argument("--runs", type=int, default=3, help="transfers per rate (the median is reported)")
    args = p.parse_args()
    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    for r in rates:
        netns.rate_bits(r)
    why = netns.check_allowed()
    if why:
        print(f"linkrate.py: {why}", file=sys.stderr)
        return 2
    netns.cleanup_on_signals()
    result = {}
    port = PORT
    with netns.NetnsCluster() as cluster:
        cluster.add_node("a")
        cluster.add_node("b")
        for rate in rates:
            cluster.shape(rate)
            runs = []
            for _ in range(args.runs):
                port += 1
                runs.append(one_run(cluster, port, args.seconds))
            result[f"{rate}_Gbit_s"] = round(statistics.median(runs), 2)
            print(f"{rate}: {statistics.median(runs):.2f} Gbit/s (runs {[round(r, 2) for r in runs]})", flush=True)
    emit_result("linkrate", result)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_recv"]:
        receive(int(sys.argv[2]))
        sys.exit(0)
    if sys.argv[1:2] == ["_send"]:
        send(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
        sys.exit(0)
    sys.exit(main())
