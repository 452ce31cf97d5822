"""Soak, load and attacks at once: a job trains while a misbehaving member attacks it.

    python benchmarks/soak.py [--seconds 30] [--workers 2] [--servers 1] [--tensors 200]

A job of separate processes (gradpress-launch --local's code, CURVE with the secret the
launcher makes) push_pulls ``--tensors`` tensors (sizes from 1 to 300k elements, every
third one onebit-compressed) round after round, checking every sum exactly (each worker
pushes integer-valued constants, whose sums are exact in float32 and through onebit).
Meanwhile this process, a member holding the job's secret, cycles through the attacks
of issue 14 against the scheduler and every server: malformed messages, random payloads
(random headers and frames for real keys, any round), huge claims (INIT_KEY of 2^62
elements, a frame just above the size limit), a peer that never reads its replies
(tens of thousands of requests), and a heartbeat flood. After ``--seconds`` the workers
stop and the job must end by itself.

The last line is ``RESULT {json}``: messages tried, push_pulls done, wrong sums, hangs
(processes that did not end in time), crashes (non-zero exits), and each role's memory
growth (resident set at the end minus after the first rounds).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

import msgpack
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from gradpress.config import Settings  # noqa: E402
from gradpress.launcher import LocalJob  # noqa: E402
from gradpress.net import protocol, transport  # noqa: E402
from gradpress.net.limits import Limits  # noqa: E402
from gradpress.net.protocol import Op  # noqa: E402
from gradpress.processes import ProcessGroup  # noqa: E402
from results import emit as emit_result  # noqa: E402

WORKER = r"""
import json, os, time, torch, gradpress.torch as bps
from gradpress.torch import ops
bps.init()
r, n = bps.rank(), bps.size()
d = os.environ["SOAK_DIR"]
T = int(os.environ["SOAK_TENSORS"])
sizes = [1 + (i * 7919) % 300000 if i % 10 == 0 else 1 + (i * 104729) % 5000 for i in range(T)]
cp = {"compressor": "onebit", "scaling": True}
def params(i):
    return cp if i % 3 == 0 and sizes[i] >= 64 else None
done = wrong = rnd = 0
def report(final=False):
    tmp = os.path.join(d, f"w{r}.json.tmp")
    with open(tmp, "w") as fh:
        json.dump({"push_pulls": done, "wrong": wrong, "rounds": rnd, "final": final}, fh)
    os.replace(tmp, os.path.join(d, f"w{r}.json"))
while not os.path.exists(os.path.join(d, "stop")):
    handles = []
    for i in range(T):
        v = float((rnd + i + r) % 17 + 1)   # an integer: exact sums
        handles.append((i, v, bps.push_pull_async(torch.full((sizes[i],), v), average=False, name=f"t{i}",
                                                   compression_params=params(i))))
    for i, v, h in handles:
        got = bps.synchronize(h)
        want = sum(float((rnd + i + k) % 17 + 1) for k in range(n))
        done += 1
        if not torch.all(got == want):
            wrong += 1
    if rnd == 0 and r == 0:
        client = ops._require()
        keys = [{"key": wk.key, "count": wk.count, "server": wk.server, "onebit": params(i) is not None}
                for i in range(T) for wk in client.tensor(f"t{i}").keys]
        servers = [[s.host, s.port] for s in client.book.servers]
        with open(os.path.join(d, "targets.json.tmp"), "w") as fh:
            json.dump({"keys": keys, "servers": servers}, fh)
        os.replace(os.path.join(d, "targets.json.tmp"), os.path.join(d, "targets.json"))
    rnd += 1
    if rnd % 5 == 0:
        report()
report(final=True)
bps.shutdown()
"""


class Attacker:
    """A member of the job (it holds the secret) that misbehaves in every way issue 14 lists."""

    def __init__(self, secret: str, scheduler: tuple[str, int], targets: dict, seed: int = 0):
        self.ctx = zmq.Context()
        self.settings = Settings(job_secret=secret)
        self.scheduler = scheduler
        self.servers = [tuple(s) for s in targets["servers"]]
        self.keys = targets["keys"]
        self.rng = random.Random(seed)
        self.lazy: list[zmq.Socket] = []
        self.tried = {"malformed": 0, "random": 0, "huge": 0, "never_read": 0, "flood": 0}

    def socket(self, host: str, port: int, rcvhwm: int | None = None) -> zmq.Socket:
        sock = transport.job_socket(self.ctx, zmq.DEALER, self.settings, binds=False)
        sock.setsockopt(zmq.LINGER, 0)
        if rcvhwm is not None:
            sock.setsockopt(zmq.RCVHWM, rcvhwm)
            sock.setsockopt(zmq.RCVBUF, 4096)
        sock.connect(f"tcp://{host}:{port}")
        return sock

    def targets(self) -> list[tuple[str, int]]:
        return [self.scheduler, *self.servers]

    def send(self, sock: zmq.Socket, frames: list, kind: str, deadline_s: float = 10.0) -> None:
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                sock.send_multipart(frames, zmq.NOBLOCK)
                self.tried[kind] += 1
                return
            except zmq.Again:  # the receiver's queue is full: it is busy or it cut us off
                if time.monotonic() > deadline:
                    return
                time.sleep(0.001)

    def malformed(self) -> None:
        v = protocol.PROTOCOL_VERSION
        key = self.rng.choice(self.keys)

        def enc(**h):
            return msgpack.packb({"v": v, "from": "soak", **h})
        garbage = [[b"\x00\xffnot msgpack"], [msgpack.packb([1, 2, 3])], [enc(op=int(Op.PUSH)), b"1234"],
                   [enc(op=999)], [enc(op=int(Op.PUSH), key="k", round=0, dtype="float32", count=1)],
                   [enc(op=int(Op.PUSH), key=key["key"], round=0, dtype="float32", count=key["count"]), b"12"],
                   [enc(op=int(Op.PULL), key=key["key"], round=10 ** 9)],
                   [enc(op=int(Op.BARRIER), group="x" * 100, seq=-5)], [enc(op=int(Op.HEARTBEAT), extra=1)]]
        for host, port in self.targets():
            sock = self.socket(host, port)
            for frames in garbage:
                self.send(sock, frames, "malformed")
            sock.close()

    def random_payloads(self, n: int) -> None:
        for host, port in self.servers:
            sock = self.socket(host, port)
            for _ in range(n):
                key = self.rng.choice(self.keys)
                fields = {"key": key["key"], "round": self.rng.choice([0, 1, 2, 10 ** 6, self.rng.randrange(1 << 40)]),
                          "dtype": self.rng.choice(protocol.DTYPES), "count": key["count"]}
                if key["onebit"] or self.rng.random() < 0.3:
                    fields.update(codec="onebit", meta={"codec": "onebit", "n": self.rng.choice([key["count"], 7])})
                frames = [protocol.encode(Op.PUSH, "soak", **fields)]
                frames += [os.urandom(self.rng.choice([0, 4, 8, 64, 4096]))
                           for _ in range(self.rng.randrange(4))]
                if self.rng.random() < 0.2:
                    frames = [os.urandom(self.rng.randrange(1, 200))] + frames[1:]
                self.send(sock, frames, "random")
            sock.close()

    def huge_claims(self, limit_bytes: int, big_frame: bool) -> None:
        for host, port in self.servers:
            sock = self.socket(host, port)
            self.send(sock, [protocol.encode(Op.INIT_KEY, "soak", key=(1 << 40) + self.rng.randrange(1000),
                                             name="huge", count=1 << 62, dtype="float32")], "huge")
            if big_frame:  # one real frame just above the limit: libzmq drops the connection
                self.send(sock, [protocol.encode(Op.STATE, "soak", key=1), bytes(limit_bytes + 1)], "huge")
            sock.close()

    def never_read(self, n: int) -> None:
        """Requests that each get a reply, from a peer that reads none of them."""
        register = protocol.encode(Op.REGISTER, "soak", role="worker", host="h", port=1, worker_id=0,
                                   local_rank=0, local_size=1, pid=1)
        pull = protocol.encode(Op.PULL, "soak", key=(1 << 40) + 1, round=0)
        for (host, port), msg in [(self.scheduler, register)] + [(s, pull) for s in self.servers]:
            sock = self.socket(host, port, rcvhwm=1)
            for _ in range(n):
                self.send(sock, [msg], "never_read", deadline_s=0.5)
            self.lazy.append(sock)  # kept connected, unread, until the end: as a stuck peer would

    def flood(self, seconds: float) -> None:
        sock = self.socket(*self.scheduler)
        beat = [protocol.encode(Op.HEARTBEAT, "soak")]
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                for _ in range(200):
                    sock.send_multipart(beat, zmq.NOBLOCK)
                    self.tried["flood"] += 1
            except zmq.Again:
                time.sleep(0.0005)
        sock.close()

    def close(self) -> None:
        self.ctx.destroy(linger=0)


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=30.0, help="how long the job trains under attack")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--tensors", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="gp-soak-")
    env = dict(os.environ, PS_HEARTBEAT_INTERVAL="0.5", PS_HEARTBEAT_TIMEOUT="5", GRADPRESS_OP_TIMEOUT_S="60",
               OMP_NUM_THREADS="1", SOAK_DIR=tmp, SOAK_TENSORS=str(args.tensors), BYTEPS_MIN_COMPRESS_BYTES="0")
    env.pop("GRADPRESS_INSECURE", None)
    group = ProcessGroup(log_dir=tmp)
    job = LocalJob(args.workers, args.servers, env, group)
    script = os.path.join(tmp, "worker.py")
    with open(script, "w") as fh:
        fh.write(WORKER)
    result = {"seconds": args.seconds, "workers": args.workers, "servers": args.servers, "tensors": args.tensors}
    attacker = None
    try:
        job.start([sys.executable, script], os.path.join(tmp, "port"))
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(tmp, "targets.json")):
            if time.monotonic() > deadline or any(pr.poll() is not None for pr in group.procs.values()):
                raise RuntimeError(f"the job did not start; logs in {tmp}")
            time.sleep(0.1)
        targets = json.load(open(os.path.join(tmp, "targets.json")))
        roles = [n for n in group.procs if not n.startswith("worker")]
        rss0 = {n: rss_bytes(group.procs[n].pid) for n in roles}
        attacker = Attacker(job.env["GRADPRESS_JOB_SECRET"], ("127.0.0.1", job.port), targets, args.seed)
        limit = Limits(Settings().partition_bytes).data_frame_bytes
        end = time.monotonic() + args.seconds
        cycle = 0
        while time.monotonic() < end:
            attacker.malformed()
            attacker.random_payloads(2000)
            attacker.huge_claims(limit, big_frame=cycle == 0)
            attacker.never_read(20_000)
            attacker.flood(min(3.0, max(0.0, end - time.monotonic())))
            cycle += 1
        rss1 = {n: rss_bytes(group.procs[n].pid) for n in roles}  # still running: after every attack
        open(os.path.join(tmp, "stop"), "w").close()
        hangs = 0
        finish_by = time.monotonic() + 120
        for name, proc in group.procs.items():
            while proc.poll() is None and time.monotonic() < finish_by:
                time.sleep(0.1)
            if proc.poll() is None:
                hangs += 1
        workers = [json.load(open(os.path.join(tmp, f"w{i}.json"))) for i in range(args.workers)
                   if os.path.exists(os.path.join(tmp, f"w{i}.json"))]
        result.update(
            attack_cycles=cycle, messages_tried=sum(attacker.tried.values()), tried=attacker.tried,
            push_pulls=sum(w["push_pulls"] for w in workers), rounds=min((w["rounds"] for w in workers), default=0),
            wrong_sums=sum(w["wrong"] for w in workers), hangs=hangs,
            crashes=sum(1 for pr in group.procs.values() if pr.poll() not in (None, 0)),
            exit_codes={n: pr.poll() for n, pr in group.procs.items()},
            rss_start_mb={n: round(v / 2 ** 20, 1) for n, v in rss0.items()},
            rss_growth_mb={n: round((rss1[n] - rss0[n]) / 2 ** 20, 1) for n in roles},
            cut_off_lines=sum(open(group.log_path(n), errors="replace").read().count("cut off peer") for n in roles),
            logs=tmp)
    finally:
        if attacker is not None:
            attacker.close()
        for pr in group.procs.values():
            if pr.poll() is None:
                pr.kill()
    emit_result("soak", result)
    return 0 if result.get("wrong_sums", 1) == 0 and result.get("hangs", 1) == 0 and not result.get("crashes") else 1


if __name__ == "__main__":
    sys.exit(main())
