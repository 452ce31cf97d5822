"""The job's members: who may register, who did, their ranks and the address book.

A worker or server registers once; the job starts when DMLC_NUM_WORKER machines'
worth of workers (BYTEPS_LOCAL_SIZE each) and DMLC_NUM_SERVER servers did. A
registration with wrong numbers, or one that clashes with a member already kept,
is refused with the reason before anything is kept.
No sockets here: the scheduler sends what the roster decides.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .. import logs
from ..config import MAX_LOCAL_SIZE, MAX_SERVER_LANES
from ..net import transport

# A machine id (host.machine_id: a boot id and a cgroup path), at most this long.
MAX_MACHINE_ID = 512


@dataclass
class Member:
    identity: bytes
    role: str
    host: str
    port: int
    worker_id: int
    local_rank: int
    local_size: int
    pid: int
    machine: str = ""
    local_reduce: bool = False
    ports: tuple[int, ...] = ()   # a server's lanes (the first is ``port``)
    server_id: int = -1           # the rank a server asked for (GRADPRESS_SERVER_ID); -1: any
    enable_async: bool = False    # BYTEPS_ENABLE_ASYNC (every worker and server must agree)
    launch: str = ""              # GRADPRESS_LAUNCH_ID: the process its launcher started, named in its reports
    agree: dict = field(default_factory=dict)  # a worker's settings that every worker gives alike
    rank: int = -1
    last_seen: float = field(default_factory=time.monotonic)
    finished: bool = False

    @property
    def name(self) -> str:
        return transport.node_name(self.role, self.rank)


class Roster:
    def __init__(self, num_worker: int, num_server: int, enable_async: bool = False):
        self.num_worker = num_worker  # machines, each with local_size worker processes
        self.num_server = num_server
        self.enable_async = enable_async  # the scheduler's BYTEPS_ENABLE_ASYNC, which every member must share
        self.members: dict[bytes, Member] = {}  # in registration order: ranks are assigned in it
        self.registered = False  # every member registered and ranked: registration is closed

    def workers(self) -> list[Member]:
        return [m for m in self.members.values() if m.role == "worker"]

    def servers(self) -> list[Member]:
        return [m for m in self.members.values() if m.role == "server"]

    # ---- registration ---------------------------------------------------

    def refusal(self, identity: bytes, h: dict) -> str:
        """Why this REGISTER is refused ('' if it is not)."""
        if self.registered or identity in self.members:
            return (f"registration is closed: the job is already running with its DMLC_NUM_SERVER={self.num_server} "
                    f"server(s) and DMLC_NUM_WORKER={self.num_worker} worker machine(s)")
        role = h["role"]
        if role not in ("worker", "server"):
            return f"role {logs.peer(role)} cannot register; expected worker or server"
        wrong = registration_problem(h) or self._async_clash(h)
        if wrong:
            return wrong
        return self._worker_clash(h) if role == "worker" else self._server_clash(h)

    def _full(self, role: str, expected: int, variables: str) -> str:
        """Why one more ``role`` cannot join ('' while fewer than ``expected`` are in): a node
        over the count would never let the job complete, which waited out its connect timeout."""
        kept = sum(m.role == role for m in self.members.values())
        return (f"{variables}: all {expected} {role} processes registered already (and none went silent for "
                f"PS_HEARTBEAT_TIMEOUT, which gives its place up)") if kept >= expected else ""

    def _async_clash(self, h: dict) -> str:
        """Asynchronous training where the scheduler (and the nodes it kept) trains
        synchronously, or the other way: servers that sum the pushes where workers push deltas
        zeroed the model, and the reverse gave each worker other parameters, without an error."""
        mine = h.get("enable_async", False)
        if mine == self.enable_async:
            return ""
        return (f"BYTEPS_ENABLE_ASYNC={int(mine)} differs from the scheduler's {int(self.enable_async)}: the "
                f"scheduler and every worker and server of the job must set it alike")

    def _worker_clash(self, h: dict) -> str:
        """What a worker's REGISTER contradicts among the workers already kept ('' if nothing)."""
        workers = self.workers()
        if workers and h["local_size"] != workers[0].local_size:
            return (f"BYTEPS_LOCAL_SIZE={h['local_size']} differs from "
                    f"{workers[0].local_size} of the workers already registered")
        mine, theirs = h.get("agree", {}), workers[0].agree if workers else {}
        apart = next((k for k in sorted(set(mine) | set(theirs)) if workers and mine.get(k) != theirs.get(k)), None)
        if apart is not None:
            return (f"{apart}={mine.get(apart)} differs from {theirs.get(apart)} of the worker registered already "
                    f"(pid {workers[0].pid}): every worker of the job must set it alike")
        if workers and h.get("local_reduce", False) != workers[0].local_reduce:
            return (f"GRADPRESS_LOCAL_REDUCE={int(h.get('local_reduce', False))} differs from "
                    f"{int(workers[0].local_reduce)} of the workers already registered (the job must agree)")
        if h["worker_id"] >= self.num_worker:
            return f"DMLC_WORKER_ID={h['worker_id']} >= DMLC_NUM_WORKER={self.num_worker}"
        slot = (h["worker_id"], h["local_rank"])
        if h["worker_id"] >= 0 and any((m.worker_id, m.local_rank) == slot for m in workers):
            return f"DMLC_WORKER_ID={slot[0]} BYTEPS_LOCAL_RANK={slot[1]} is already taken"
        return self._full("worker", self.num_worker * h["local_size"],
                          f"DMLC_NUM_WORKER={self.num_worker} x BYTEPS_LOCAL_SIZE={h['local_size']}")

    def _server_clash(self, h: dict) -> str:
        """Why a server's asked-for rank cannot be had ('' if it can, or it asked for none)."""
        asked = h.get("server_id", -1)
        if asked >= self.num_server:
            return f"GRADPRESS_SERVER_ID={asked} >= DMLC_NUM_SERVER={self.num_server}"
        if asked >= 0 and any(m.server_id == asked for m in self.servers()):
            return f"GRADPRESS_SERVER_ID={asked} is already taken"
        return self._full("server", self.num_server, f"DMLC_NUM_SERVER={self.num_server}")

    def silent_holder(self, h: dict, heard_before: float) -> Member | None:
        """Before the job starts, the member whose place a REGISTER refused for it (its slot,
        or the last of the count) would take, where that member has not been heard from
        since ``heard_before``: a node waiting for the job to start heartbeats, so it died (a
        pod that restarts registers again, and its first self held the place for good)."""
        if self.registered:
            return None
        silent = [m for m in self.members.values() if m.role == h["role"] and m.last_seen < heard_before]
        if h["role"] == "server" and h.get("server_id", -1) >= 0:
            silent = [m for m in silent if m.server_id == h["server_id"]]
        elif h["role"] == "worker" and h["worker_id"] >= 0:
            silent = [m for m in silent if (m.worker_id, m.local_rank) == (h["worker_id"], h["local_rank"])] or silent
        return min(silent, key=lambda m: m.last_seen, default=None)

    def add(self, identity: bytes, h: dict) -> Member:
        """Keep a REGISTER that refusal() let through."""
        member = Member(identity, h["role"], h["host"], h["port"], h["worker_id"],
                        h["local_rank"], h["local_size"], h["pid"], h.get("machine", ""),
                        h.get("local_reduce", False), tuple(h.get("ports", ())), h.get("server_id", -1),
                        h.get("enable_async", False), h.get("launch", ""), h.get("agree", {}))
        self.members[identity] = member
        return member

    def complete(self) -> bool:
        workers = self.workers()
        if not workers:
            return False
        return len(workers) == self.num_worker * workers[0].local_size and len(self.servers()) == self.num_server

    def assign_ranks(self) -> None:
        """Workers take DMLC_WORKER_ID * BYTEPS_LOCAL_SIZE + local rank, servers GRADPRESS_SERVER_ID;
        those without one, the ranks left in registration order."""
        workers = self.workers()
        local_size = workers[0].local_size
        _rank(workers, lambda m: m.worker_id * local_size + m.local_rank if m.worker_id >= 0 else -1)
        _rank(self.servers(), lambda m: m.server_id)
        self.registered = True

    def local_group_size(self, async_mode: bool) -> int:
        """How many workers of a machine reduce locally (1: none do): BYTEPS_LOCAL_SIZE where
        every worker asked for it, named its machine (DMLC_WORKER_ID) and the job is synchronous
        (an async push is applied alone, as it arrives: nothing to sum first)."""
        workers = self.workers()
        if async_mode or not workers or not all(m.local_reduce and m.worker_id >= 0 for m in workers):
            return 1
        return workers[0].local_size

    def address_book(self) -> list[dict]:
        return [{"role": m.role, "rank": m.rank, "host": m.host, "port": m.port, "machine": m.machine,
                 **({"ports": list(m.ports)} if m.ports else {})} for m in self.members.values()]

    def missing_summary(self) -> str:
        workers = sum(m.role == "worker" for m in self.members.values())
        servers = sum(m.role == "server" for m in self.members.values())
        return (f"{workers} worker process(es) of {self.num_worker} machine(s) and "
                f"{servers} of {self.num_server} server(s) registered{self._missing_slots()}")

    def _missing_slots(self) -> str:
        """The worker slots (DMLC_WORKER_ID/BYTEPS_LOCAL_RANK) not registered, where the
        workers registered so far name theirs ("" where they do not: ranks by arrival)."""
        workers = self.workers()
        if not workers or any(m.worker_id < 0 for m in workers):
            return ""
        taken = {(m.worker_id, m.local_rank) for m in workers}
        missing = [f"{i}/{j}" for i in range(self.num_worker) for j in range(workers[0].local_size)
                   if (i, j) not in taken]
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        return f"; missing DMLC_WORKER_ID/BYTEPS_LOCAL_RANK {shown}" if missing else ""

    # ---- a failed worker ------------------------------------------------

    def failed_worker(self, sender: Member | None, h: dict) -> tuple[Member | None, int]:
        """The worker an ABORT reports, if registered, and its rank (-1 if unknown).

        The sender is the failed worker itself (registered or not), or its launcher, which
        names the worker by pid, DMLC_WORKER_ID and local rank.
        """
        failed = sender if sender is not None and sender.role == "worker" and "pid" not in h else None
        if failed is None:
            failed = reported(self.workers(), h)
        # by its slot, a worker that never registered (once the job runs, a launcher whose child
        # no member is, such as another job's, names none of its workers)
        if failed is None and h.get("worker_id", -1) >= 0 and not (h.get("launch") and self.registered):
            slot = (h["worker_id"], h.get("local_rank", 0))
            failed = next((m for m in self.workers() if (m.worker_id, m.local_rank) == slot), None)
        if failed is not None and failed.rank >= 0:
            rank = failed.rank
        elif 0 <= h.get("worker_id", -1) < self.num_worker and 0 <= h.get("local_rank", 0) < MAX_LOCAL_SIZE:
            # not ranked yet (the job had not started): the rank its DMLC_WORKER_ID would have given it
            rank = h["worker_id"] * (failed.local_size if failed else 1) + h.get("local_rank", 0)
        else:
            rank = -1
        return failed, rank


def reported(members: list[Member], h: dict) -> Member | None:
    """The member an ABORT names by its process: by GRADPRESS_LAUNCH_ID alone where the report
    gives one (the pid may be a shell's that runs it, or the small pid of every pod), else by pid."""
    if h.get("launch"):
        return next((m for m in members if m.launch == h["launch"]), None)
    return next((m for m in members if m.pid == h.get("pid")), None) if "pid" in h else None


def registration_problem(h: dict) -> str:
    """What is wrong with a REGISTER's numbers ('' if nothing): checked before anything is kept."""
    if not 0 <= h["port"] <= 65535:
        return f"port {h['port']} is not a port number"
    if "ports" in h:
        ports = h["ports"]
        if h["role"] != "server" or not 1 <= len(ports) <= MAX_SERVER_LANES or ports[0] != h["port"] or \
                not all(type(p) is int and 1 <= p <= 65535 for p in ports) or len(set(ports)) != len(ports):
            return (f"ports {ports!r}: a server's lanes are 1 to {MAX_SERVER_LANES} distinct port numbers, "
                    f"its port ({h['port']}) first")
    if "server_id" in h and (h["role"] != "server" or h["server_id"] < -1):
        return f"server_id {h['server_id']}: a server's GRADPRESS_SERVER_ID is a rank, or -1 for any"
    if not 1 <= h["local_size"] <= MAX_LOCAL_SIZE:
        return f"BYTEPS_LOCAL_SIZE={h['local_size']} is not in [1, {MAX_LOCAL_SIZE}]"
    if not 0 <= h["local_rank"] < h["local_size"]:
        return f"BYTEPS_LOCAL_RANK={h['local_rank']} is not in [0, BYTEPS_LOCAL_SIZE={h['local_size']})"
    if h["worker_id"] < -1:
        return f"DMLC_WORKER_ID={h['worker_id']} is negative"
    if h["pid"] < 0:
        return f"pid {h['pid']} is negative"
    agree = h.get("agree", {})
    if "agree" in h and (h["role"] != "worker" or len(agree) > 64 or not all(
            type(k) is str and len(k) <= 64 and type(v) in (int, float, str) and len(str(v)) <= 64
            for k, v in agree.items())):
        return "agree: a worker's settings, at most 64 names and values of 64 characters"
    if len(h.get("machine", "")) > MAX_MACHINE_ID:
        return (f"machine id of {len(h['machine'])} characters (at most {MAX_MACHINE_ID}): the address book "
                f"repeats every node's to every node")
    return ""


def _rank(members: list[Member], asked) -> None:
    """Each member the rank ``asked(member)`` names (registration checked they differ); those
    that ask for none (-1) the ranks left, in ``members``' order (registration order)."""
    taken = {asked(m) for m in members} - {-1}
    free = iter(r for r in range(len(members)) if r not in taken)
    for m in members:
        m.rank = asked(m) if asked(m) >= 0 else next(free)
