"""What the planner knows about a job, all of it measured in the running job.

- the backward timeline: when each gradient becomes ready, relative to the start of
  the iteration (mean over the profiled steps), when backward ends, how long the
  optimizer's own step takes;
- what each candidate codec costs here: compress and decompress time as a linear fit
  in bytes (``LinearCost``), from a short calibration (``calibrate.py``, cached per host);
- the network: latency and bytes per second of one node's link, from real push/pulls
  of a few sizes (an alpha-beta fit, ``fit_link``), and what one message costs the
  worker's communication thread and the server (``message_s``), from many tiny
  push/pulls at once (``fit_message``): the cost that makes fusing small tensors pay.

- the host's CPUs, where workers and servers share them (``HostShare``): how many cores,
  how many of the job's workers and servers run on rank 0's host, the CPU one worker's
  training takes per iteration (measured in the job, communication threads left out), and
  what a byte sent or received costs a node's sockets (ZeroMQ's threads: TCP, CURVE).

A ``Profile`` is plain data: rank 0 measures it and broadcasts it as JSON, so every
worker plans from the same numbers and computes the same plan. ``GRADPRESS_PLAN_FILE``
saves it for ``gradpress-plan``.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

PROFILE_VERSION = 1
MAX_NODES = 1 << 16           # workers, servers, a server's threads: the simulation's arrays are this big
MAX_PARTITIONS = 1 << 22      # a step's partitions, which the simulation walks one by one


class ProfileError(ValueError):
    """A profile (or plan file) that cannot be used; the message says what is wrong."""


@dataclass(frozen=True)
class LinearCost:
    """``fixed_s + per_byte_s * nbytes``: a kernel's time for an input of ``nbytes`` (fp32)."""
    fixed_s: float
    per_byte_s: float

    def __call__(self, nbytes: float) -> float:
        return self.fixed_s + self.per_byte_s * nbytes

    def scaled(self, factor: float) -> "LinearCost":
        return LinearCost(self.fixed_s * factor, self.per_byte_s * factor)


@dataclass(frozen=True)
class CodecCost:
    """One codec option's costs and size: ``payload_ratio`` is payload bytes per fp32 byte."""
    compress: LinearCost      # worker: error feedback + encode (the server's recompression too,
                              # unless server_compress says otherwise)
    decompress: LinearCost    # worker: decode into the output
    add: LinearCost           # server: decode one push into the fp32 sum
    payload_ratio: float
    # low-rank options (powersgd, acpsgd): the factor rank and push_pull rounds per step, with
    # the smallest size ratio of a matrix worth factoring; compress is then one step's factor
    # work on the training thread (per matrix byte), decompress the reconstruction, and the
    # payload is the factors (``factor_bytes``), not ``payload_ratio``
    rank: int = 0
    rounds: int = 0
    min_rate: float = 0.0
    # the server's recompression of a round's aggregate where it differs from ``compress``:
    # random-k without scaling is summed and recompressed as its k values (server/values_sum.py)
    server_compress: LinearCost | None = None
    # no codec, only the wire's dtype (auto's fp16_raw): where a machine's workers reduce
    # locally, each hands its payload over as it is (the owner sums payloads), not fp32
    uncompressed: bool = False

    @classmethod
    def from_dict(cls, c: dict) -> "CodecCost":
        """What ``dataclasses.asdict`` made of one (profiles, the calibration's cache); the
        fields added later take their defaults."""
        server = c.get("server_compress")
        return cls(_cost(c["compress"]), _cost(c["decompress"]), _cost(c["add"]),
                   float(c["payload_ratio"]), int(c.get("rank", 0)), int(c.get("rounds", 0)),
                   float(c.get("min_rate", 0.0)), None if server is None else _cost(server),
                   bool(c.get("uncompressed", False)))

    @property
    def recompress(self) -> LinearCost:
        """What the server's recompression of a round's aggregate costs."""
        return self.compress if self.server_compress is None else self.server_compress

    @property
    def low_rank(self) -> bool:
        return self.rank > 0

    def factors(self, rows: int, cols: int) -> bool:
        """Whether a rows x cols matrix travels as factors under this option."""
        r = min(self.rank, rows, cols)
        return self.low_rank and rows > 1 and cols > 1 and rows * cols >= self.min_rate * r * (rows + cols)

    def factor_bytes(self, rows: int, cols: int) -> float:
        """Bytes of factors one step sends for a rows x cols matrix: ACP-SGD alternates P (rows x r)
        and Q (cols x r), PowerSGD sends both."""
        r = min(self.rank, rows, cols)
        return 4.0 * r * (rows + cols) * (1.0 if self.rounds > 1 else 0.5)


@dataclass(frozen=True)
class TensorProfile:
    name: str
    nbytes: int
    ready_s: float            # gradient ready, seconds after the iteration started
    priority: int             # larger goes first (layers the next forward pass needs first)
    rows: int = 1             # a gradient of 2+ dimensions: its first dimension (low-rank options)
    itemsize: int = 4         # its dtype's bytes an element (nbytes counts float32, as codecs take it)

    @property
    def cols(self) -> int:
        return self.nbytes // 4 // max(self.rows, 1)


@dataclass(frozen=True)
class Link:
    """One node's link, each direction: a message of b bytes takes ``alpha_s + b / bytes_per_s``."""
    alpha_s: float
    bytes_per_s: float


@dataclass(frozen=True)
class HostShare:
    """Rank 0's host and who shares its CPUs: ``cores`` CPUs for ``workers`` of the job's
    workers (rank 0 among them) and ``servers`` of its servers. ``train_cpu_s``: CPU seconds
    per iteration of one worker outside its communication (forward, backward, the step;
    torch's pools included), without a plan's own work (factors). ``wire_s_per_byte``: CPU
    seconds a node's sockets (ZeroMQ's I/O threads: TCP, and CURVE's cipher) spend per byte
    it sends or receives; in shared memory, next to nothing."""
    cores: float
    workers: int
    servers: int
    train_cpu_s: float
    wire_s_per_byte: float = 0.0


@dataclass(frozen=True)
class Profile:
    workers: int
    servers: int
    tensors: tuple[TensorProfile, ...]   # in the order their gradients became ready
    backward_end_s: float                # every gradient computed (step() called)
    step_s: float                        # the wrapped optimizer's step
    codecs: dict[str, CodecCost]         # option name -> costs; "none" is the raw fp32 path
    link: Link
    message_s: float = 0.0               # serial CPU per partition: sending it and landing its reply
    partition_bytes: int = 4096000
    credit: int = 8
    engine_threads: int = 2              # threads doing a server's sums (its I/O thread: 1)
    version: int = PROFILE_VERSION
    notes: dict = field(default_factory=dict)
    host: HostShare | None = None        # None: no CPU is shared (or it was not measured)
    local_size: int = 1                  # workers of a machine that sum each partition first (1: none)
    # where the workers' gradients live: "cuda" moves each partition between the device and
    # the host (the raw path's compress and decompress are then the copies, codecs run on the
    # device, and a fused group is gathered on the device, at no cost that counts)
    device: str = "cpu"

    def __post_init__(self) -> None:
        fields = {k: v for k, v in asdict(self).items() if k != "notes"}  # (notes: what was measured, as it was)
        for where, value in _numbers(fields):  # a NaN time never lands: the simulation would not end
            check(where.endswith(".priority") or (math.isfinite(value) and value >= 0),  # (priorities: any)
                  f"{where} = {value}: must be a finite number, at least 0")
        check(self.workers >= 1 and self.servers >= 1, "workers and servers must be at least 1")
        check(self.workers <= MAX_NODES and self.servers <= MAX_NODES and self.engine_threads <= MAX_NODES,
              f"workers, servers and engine_threads must be at most {MAX_NODES}")
        check(len(self.tensors) >= 1, "a profile needs at least one tensor")
        check("none" in self.codecs, "the codec costs lack the raw path 'none'")
        check(self.partition_bytes > 0 and self.credit >= 1 and self.engine_threads >= 1,
              "partition_bytes, credit and engine_threads must be positive")
        check(self.link.bytes_per_s > 0, f"link {self.link}: needs a positive rate")
        check(self.device in ("cpu", "cuda"), f"device {self.device!r}: must be 'cpu' or 'cuda'")
        check(self.local_size >= 1 and self.workers % self.local_size == 0,
              f"local_size {self.local_size}: must be at least 1 and divide the {self.workers} workers")
        check(sum(-(-t.nbytes // self.partition_bytes) for t in self.tensors) <= MAX_PARTITIONS,
              f"partition_bytes {self.partition_bytes}: more than {MAX_PARTITIONS} partitions")
        for t in self.tensors:
            check(t.nbytes % 4 == 0, f"tensor {t.name!r}: size {t.nbytes} must be float32 bytes, a multiple of 4")
            check(t.rows >= 1 and (t.nbytes // 4) % t.rows == 0 and t.itemsize in (2, 4, 8),
                  f"tensor {t.name!r}: {t.rows} rows must divide its {t.nbytes // 4} elements, and its "
                  f"itemsize {t.itemsize} be 2, 4 or 8")
        h = self.host
        if h is not None:
            check(h.cores > 0 and 1 <= h.workers <= self.workers and h.servers <= self.servers,
                  f"host {h}: needs cores > 0, 1 to {self.workers} workers, 0 to {self.servers} servers")
        for name, c in self.codecs.items():
            check(c.rank == 0 or c.rounds in (1, 2),
                  f"codec {name!r}: rank {c.rank} and rounds {c.rounds} (1 or 2 for a low-rank option)")

    @property
    def pushers(self) -> int:
        """Pushes a server sums per round: one per machine where workers reduce locally."""
        return self.workers // self.local_size

    def scaled(self, workers: int | None = None, servers: int | None = None,
               bytes_per_s: float | None = None) -> "Profile":
        """The same model and machine in a job of another shape or link rate (for projections):
        each host is shared as rank 0's was (as many of the job's workers and servers on it, at
        most all of them)."""
        link = self.link if bytes_per_s is None else Link(self.link.alpha_s, bytes_per_s)
        workers, servers = workers or self.workers, servers or self.servers
        host = self.host and replace(self.host, workers=min(self.host.workers, workers),
                                     servers=min(self.host.servers, servers))
        return Profile(workers, servers, self.tensors, self.backward_end_s,
                       self.step_s, self.codecs, link, self.message_s, self.partition_bytes, self.credit,
                       self.engine_threads, self.version, dict(self.notes), host,
                       self.local_size if workers % self.local_size == 0 else 1, self.device)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str = "profile") -> "Profile":
        """Parse and check a profile; every problem is a ProfileError naming ``where``."""
        try:
            d = json.loads(text)
            if not isinstance(d, dict):
                raise ProfileError(f"{where}: expected a JSON object")
            if d.get("version") != PROFILE_VERSION:
                raise ProfileError(f"{where}: profile version {d.get('version')!r}; this gradpress reads "
                                   f"{PROFILE_VERSION}")
            codecs = {name: CodecCost.from_dict(c) for name, c in d["codecs"].items()}
            tensors = tuple(TensorProfile(str(t["name"]), _int(t["nbytes"]), float(t["ready_s"]), _int(t["priority"]),
                                          _int(t.get("rows", 1)), _int(t.get("itemsize", 4))) for t in d["tensors"])
            h = d.get("host")
            host = None if h is None else HostShare(float(h["cores"]), _int(h["workers"]), _int(h["servers"]),
                                                    float(h["train_cpu_s"]), float(h.get("wire_s_per_byte", 0.0)))
            return cls(_int(d["workers"]), _int(d["servers"]), tensors, float(d["backward_end_s"]),
                       float(d["step_s"]), codecs, Link(float(d["link"]["alpha_s"]), float(d["link"]["bytes_per_s"])),
                       float(d["message_s"]), _int(d["partition_bytes"]),
                       _int(d["credit"]), _int(d["engine_threads"]), int(d["version"]), dict(d.get("notes", {})), host,
                       _int(d.get("local_size", 1)), str(d.get("device", "cpu")))
        except ProfileError as e:  # (the checks of the fields name the field, this says where it came from)
            raise ProfileError(str(e) if str(e).startswith(where) else f"{where}: {e}") from None
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise ProfileError(f"{where}: not a gradpress profile ({type(e).__name__}: {e})") from None

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ProfileError(f"plan file {path}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise ProfileError(f"plan file {path}: not a text file ({e.reason} at byte {e.start})") from None
        return cls.from_json(text, f"plan file {path}")


def check(ok: bool, message: str) -> None:
    if not ok:
        raise ProfileError(message)


def _numbers(value, where: str = "profile"):
    """Every number in a profile's fields (``asdict``), with where it is (bools are not numbers here)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _numbers(v, f"{where}[{i}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield where, value


def _cost(c: dict) -> LinearCost:
    return LinearCost(float(c["fixed_s"]), float(c["per_byte_s"]))  # (JSON's -5 is an int: checked as a float)


def _int(value) -> int:
    """A count from JSON: an integer, or a float that is one (not a bool, not 1.7)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value):
        raise ValueError(f"{value!r} is not a whole number")
    return int(value)
