"""A cluster of Linux network namespaces with rate-limited links, for tests and benchmarks.

One namespace per node, each with one interface ``eth0`` joined by a veth pair to a
bridge that lives in a namespace of its own, so nothing touches the host's network and
no namespace has a route out (a private /24, no default route). A link of rate R means
what a NIC of rate R gives: ``tc ... tbf`` shapes the node's egress (``eth0`` in the
node's namespace) and its ingress (the veth's other end, whose egress is the bridge
sending to the node), each direction at R. Rate ``max`` takes every qdisc away: the
veth as it is, whose speed the CPU decides (``benchmarks/linkrate.py`` measures it).

Needs root and iproute2. ``remove()`` kills whatever still runs in the namespaces and
deletes them (with their veths and the bridge); ``NetnsCluster`` is a context manager, and
``cleanup_on_signals()`` turns SIGINT/SIGTERM/SIGHUP into exceptions so that the
``finally`` / ``__exit__`` runs when the benchmark is interrupted.
"""
from __future__ import annotations

import math
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
from pathlib import Path

from ..net import auth

RATE_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
UNSHAPED = "max"        # the rate name for links left as they are
MIN_BURST_BYTES = 4096  # 32 kbit
BURST_S = 0.005         # a token bucket of 5 ms at the link rate
QUEUE_LATENCY_MS = 50   # tbf drops what would wait longer than this


def rate_bits(rate: str) -> float:
    """``'100mbit'`` -> 1e8; ``'max'`` (unshaped) -> inf."""
    if rate.strip().lower() == UNSHAPED:
        return math.inf
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(kbit|mbit|gbit)", rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: expected a number and kbit, mbit or gbit, as 100mbit or 1gbit, "
                         f"or {UNSHAPED} (no limit)")
    return float(m.group(1)) * RATE_UNITS[m.group(2)]


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def tc(ns: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, "tc", *args], capture_output=True, text=True,
                          check=True, timeout=30)


def check_allowed() -> str | None:
    """Why namespaces cannot be made here, or None if they can (as far as can be told)."""
    if os.geteuid() != 0:
        return "needs root: creates network namespaces, veth pairs, a bridge and tc qdiscs"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs iproute2's `{tool}`"
    return None


class NetnsCluster:
    """Network namespaces on one bridge; each node's link shaped to one rate.

    Args:
        prefix: namespace names start with it; make it unique per run.
        subnet: the first three octets of a private /24 (random 10.251.x by default).
    """

    def __init__(self, prefix: str | None = None, subnet: str | None = None):
        self.prefix = prefix or f"gpbw{os.getpid() % 100000}{secrets.token_hex(2)}"
        self.subnet = subnet or f"10.251.{random.randrange(256)}"
        self.switch = f"{self.prefix}-sw"
        self.nodes: dict[str, tuple[str, str, str]] = {}  # name -> (namespace, address, bridge port)
        self.namespaces: list[str] = []
        self.made_etc_netns = not Path("/etc/netns").exists()
        self.rate: str | None = None
        # The job secret of every process started here whose environment sets none (nor
        # GRADPRESS_INSECURE): the jobs of one cluster are members of each other's.
        self.secret = secrets.token_hex(32)

    def __enter__(self) -> "NetnsCluster":
        self.start()
        return self

    def start(self) -> None:
        """The bridge's namespace (raises CalledProcessError where namespaces cannot be made)."""
        self._add_ns(self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        ip("-n", self.switch, "link", "set", "lo", "up")

    def __exit__(self, *exc) -> None:
        self.remove()

    def add_node(self, name: str) -> str:
        """A namespace wired to the bridge; returns its address."""
        i = len(self.nodes)
        ns, addr, port = f"{self.prefix}-{name}", f"{self.subnet}.{i + 2}", f"p{i}"
        self._add_ns(ns)
        ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", self.switch)
        ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        if ip("-n", ns, "route", "show", "default").stdout.strip():
            raise RuntimeError(f"{ns} has a default route; traffic must stay inside the namespaces")
        self.nodes[name] = (ns, addr, port)
        return addr

    def ns(self, name: str) -> str:
        return self.nodes[name][0]

    def addr(self, name: str) -> str:
        return self.nodes[name][1]

    def hosts(self, name: str, entries: dict[str, str]) -> None:
        """Names the node resolves (``ip netns exec`` mounts /etc/netns/<ns>/hosts as /etc/hosts)."""
        d = Path("/etc/netns") / self.ns(name)
        d.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost"] + [f"{addr} {host}" for host, addr in entries.items()]
        (d / "hosts").write_text("\n".join(lines) + "\n")

    def shape(self, rate: str) -> None:
        """Limit every node's link to ``rate`` in both directions (replacing earlier limits)."""
        bits = rate_bits(rate)
        if math.isinf(bits):
            for ns, _, port in self.nodes.values():
                for where, dev in ((ns, "eth0"), (self.switch, port)):
                    if "tbf" in tc(where, "qdisc", "show", "dev", dev).stdout:
                        tc(where, "qdisc", "del", "dev", dev, "root")
            self.rate = rate
            return
        burst = max(MIN_BURST_BYTES, int(bits / 8 * BURST_S))
        spec = ["tbf", "rate", f"{int(bits)}bit", "burst", str(burst), "latency", f"{QUEUE_LATENCY_MS}ms"]
        for ns, _, port in self.nodes.values():
            tc(ns, "qdisc", "replace", "dev", "eth0", "root", *spec)              # what the node sends
            tc(self.switch, "qdisc", "replace", "dev", port, "root", *spec)       # what it receives
        self.rate = rate

    def tx_bytes(self, name: str) -> int:
        """Bytes the node has sent on its link (its ``eth0`` counter)."""
        out = subprocess.run(["ip", "netns", "exec", self.ns(name), "cat", "/sys/class/net/eth0/statistics/tx_bytes"],
                             capture_output=True, text=True, check=True, timeout=30)
        return int(out.stdout)

    def popen(self, name: str, argv: list[str], env: dict, log: Path, cwd: str | None = None) -> subprocess.Popen:
        """Start ``argv`` in the node's namespace, in a session of its own, output to ``log``;
        with the cluster's job secret unless ``env`` sets a secret or GRADPRESS_INSECURE."""
        env = {**env, **auth.secret_env(env, self.secret)}
        with open(log, "wb") as fh:
            return subprocess.Popen(["ip", "netns", "exec", self.ns(name), *argv], env=env, cwd=cwd, stdout=fh,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def _add_ns(self, ns: str) -> None:
        self.namespaces.append(ns)  # before creating: cleanup must see a half-made one
        ip("netns", "add", ns)

    def remove(self) -> None:
        """Kill what runs in the namespaces, delete them (veths and bridge go with them)."""
        for ns in reversed(self.namespaces):
            for pid in ip("netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            ip("netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        if self.made_etc_netns:
            try:
                Path("/etc/netns").rmdir()  # only if empty: another run may be using it
            except OSError:
                pass

    def leftovers(self) -> list[str]:
        listed = ip("netns", "list", check=False).stdout
        return [ns for ns in self.namespaces
                if re.search(rf"^{re.escape(ns)}\b", listed, re.M) or (Path("/etc/netns") / ns).exists()]


class Interrupted(BaseException):
    """A signal arrived; raised so that ``finally`` blocks clean up."""


def cleanup_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP raise ``Interrupted`` (later ones are ignored while cleaning up)."""
    def handler(signum, _frame):
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(f"interrupted by {signal.Signals(signum).name}")

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)
