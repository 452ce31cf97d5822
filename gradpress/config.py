"""Settings: one typed definition per setting, read from a TOML file and the environment.

Every setting is a field of :class:`Settings` with a default, an environment name
(BytePS's / ps-lite's name where they have the setting, ``GRADPRESS_*`` otherwise)
and a one-line meaning. Values come, later ones winning, from the defaults, from a
TOML job file (``GRADPRESS_CONFIG`` or ``gradpress-launch --config``) and from the
environment. ``docs/env.md`` lists them all (and a test keeps it in step).
"""
from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any, Mapping

ROLES = ("scheduler", "server", "worker")
MAX_LOCAL_SIZE = 1024  # the workers of a machine at most (BYTEPS_LOCAL_SIZE; a --local job's each role)
MAX_SERVER_LANES = 16  # (the I/O threads a process runs at most by default: net/transport.py)
MAX_TIMEOUT_S = 1e6  # a deadline's most: 11 days (ZeroMQ takes a send timeout in int32 milliseconds)
MAX_PARTITION_BYTES = 1 << 30


def _setting(default: Any, env: str, doc: str, secret: bool = False) -> Any:
    return field(default=default, repr=not secret, metadata={"env": env, "doc": doc})


@dataclass(frozen=True)
class Settings:
    config_file: str = _setting("", "GRADPRESS_CONFIG", "TOML job file read before the environment (gradpress-launch --config sets it)")
    role: str = _setting("worker", "DMLC_ROLE", "this process's role: scheduler, server or worker")
    num_worker: int = _setting(1, "DMLC_NUM_WORKER", "number of worker machines (each runs BYTEPS_LOCAL_SIZE workers)")
    num_server: int = _setting(1, "DMLC_NUM_SERVER", "number of server processes")
    root_uri: str = _setting("127.0.0.1", "DMLC_PS_ROOT_URI", "address (IP or DNS name) of the scheduler")
    root_port: int = _setting(9000, "DMLC_PS_ROOT_PORT", "port the scheduler listens on")
    worker_id: int = _setting(-1, "DMLC_WORKER_ID", "this worker machine's index; -1: assigned in order of registration")
    server_id: int = _setting(-1, "GRADPRESS_SERVER_ID", "this server's rank; -1: assigned in order of registration (gradpress-launch --local numbers its servers)")
    node_host: str = _setting("", "DMLC_NODE_HOST", "address other nodes reach this node at; empty: the local address that routes to the scheduler")
    server_port: int = _setting(0, "GRADPRESS_SERVER_PORT", "port a server binds; 0: any free port, announced through the scheduler")
    local_rank: int = _setting(0, "BYTEPS_LOCAL_RANK", "index of this worker process on its machine")
    local_size: int = _setting(1, "BYTEPS_LOCAL_SIZE", "number of worker processes on this machine")
    partition_bytes: int = _setting(4096000, "BYTEPS_PARTITION_BYTES", "tensors are split into partitions of at most this many bytes")
    scheduling_credit: int = _setting(8, "BYTEPS_SCHEDULING_CREDIT", "partition pushes a worker keeps on the wire (not yet acknowledged by a server)")
    server_engine_threads: int = _setting(-1, "BYTEPS_SERVER_ENGINE_THREAD", "numeric engine threads per server (keys of up to 64 KiB are summed on its I/O thread whatever the count); 0: the I/O thread sums every key itself; -1: 2, or 0 where the server has fewer than 2 of its host's cores to itself")
    keep_freed_memory: bool = _setting(True, "GRADPRESS_KEEP_FREED_MEMORY", "1: workers and servers have glibc's malloc serve blocks of up to 256 MB from its heap and keep freed memory for reuse (no fresh pages to fault in every step; the process keeps its peak heap); 0: leave malloc as it is")
    exit_skip_gc: bool = _setting(True, "GRADPRESS_EXIT_SKIP_GC", "1: at exit, after gradpress's shutdown, workers, servers and the scheduler skip Python's final garbage collections (about 0.9 CPU-seconds per torch worker); objects only a reference cycle keeps alive then are not finalized; 0: Python's own exit")
    enable_async: bool = _setting(False, "BYTEPS_ENABLE_ASYNC", "asynchronous mode: pushes add into the store at once, pulls read it as it is")
    local_reduce: bool = _setting(True, "GRADPRESS_LOCAL_REDUCE", "workers of one machine (same DMLC_WORKER_ID, BYTEPS_LOCAL_SIZE > 1) sum each partition locally first, and one of them pushes the machine's sum: one push per machine (off in async mode); 0: every worker pushes its own")
    shm: bool = _setting(True, "GRADPRESS_SHM", "a worker and a server on the same host exchange data through shared memory (sealed memfd chunks)")
    min_compress_bytes: int = _setting(65536, "BYTEPS_MIN_COMPRESS_BYTES", "tensors smaller than this travel uncompressed")
    fuse_below_bytes: int = _setting(65536, "GRADPRESS_FUSE_BELOW_BYTES", "DistributedOptimizer: 1-D gradients (biases, norms) smaller than this that travel uncompressed anyway (below BYTEPS_MIN_COMPRESS_BYTES, or no codec) are fused with their neighbours in backward order into push_pulls of up to BYTEPS_PARTITION_BYTES, one message for many instead of one each; 0: each on its own, as BytePS sends them")
    fuse_compressed_bytes: int = _setting(0, "GRADPRESS_FUSE_COMPRESSED_BYTES", "DistributedOptimizer: gradients that one codec compresses (the same compression_params, dtype and learning rate) are fused with their neighbours among them in backward order into push_pulls of up to this many bytes, compressed as one tensor: on a GPU one set of kernel launches and one copy to the host for all of them, and fewer, fuller partitions on the wire; the codec's partitions then span gradients, so the bits differ from each gradient compressed alone (MergeComp's groups); 0: each gradient compressed on its own, as BytePS does")
    group_partitions: bool = _setting(True, "GRADPRESS_GROUP_PARTITIONS", "GPU workers: the partitions of a tensor are compressed together, one set of kernel launches and one copy to the host for all of them, where the codec has such kernels (onebit, topk, randomk, fp16 and dithering with error feedback, no worker momentum) and no partition of the tensor is busy; 0: one set per partition")
    gil_switch_us: int = _setting(0, "GRADPRESS_GIL_SWITCH_US", "workers: microseconds a thread waiting for Python's GIL waits before the running one must hand it over (sys.setswitchinterval): the gradient hooks of a backward pass wait this long at most each time the communication thread runs Python; 0: Python's own (5000)")
    heartbeat_interval_s: float = _setting(1.0, "PS_HEARTBEAT_INTERVAL", "seconds between heartbeats to and from the scheduler")
    heartbeat_timeout_s: float = _setting(10.0, "PS_HEARTBEAT_TIMEOUT", "a node silent this many seconds is declared lost")
    connect_timeout_s: float = _setting(120.0, "GRADPRESS_CONNECT_TIMEOUT_S", "deadline for the whole job to register with the scheduler")
    op_timeout_s: float = _setting(300.0, "GRADPRESS_OP_TIMEOUT_S", "deadline for one declare, push_pull, barrier or broadcast")
    cpus: float = _setting(0.0, "GRADPRESS_CPUS", "cores gradpress-launch shares among the worker processes it starts for torch's threads (OMP_NUM_THREADS, where that is not set); 0: the cores this process may use. A pod sets it to its CPU request: a container's process sees the whole node")
    launch_id: str = _setting("", "GRADPRESS_LAUNCH_ID", "set by gradpress-launch on each process it starts, a random name: the process registers with it and the launcher's report of its exit names it, so that another job's launcher (a job started on this one's port by mistake) names no worker of this one; not set by hand")
    port_file: str = _setting("", "GRADPRESS_PORT_FILE", "scheduler: write the port it bound to this file (gradpress-launch --local binds port 0)")
    health_file: str = _setting("", "GRADPRESS_HEALTH_FILE", "file written once registered and touched every heartbeat (for probes), and marked finished when the node leaves its job; empty: none")
    plan_steps: int = _setting(10, "GRADPRESS_PLAN_STEPS", "compressor 'auto': steps profiled (gradients travel raw) before the first plan")
    plan_file: str = _setting("", "GRADPRESS_PLAN_FILE", "compressor 'auto': rank 0 writes its profile here (JSON, for gradpress-plan); empty: none")
    trace: str = _setting("", "GRADPRESS_TRACE", "write a Chrome-trace JSON of partition stages to this path; empty: off")
    sparse_density: float = _setting(0.25, "GRADPRESS_SPARSE_DENSITY", "DistributedOptimizer: a dense gradient of 2+ dimensions whose fraction of non-zero rows (mean over workers, first step) is below this travels row-sparse from the next step; 0: never")
    sparse_seed: int = _setting(0, "GRADPRESS_SPARSE_SEED", "seed of the hash that spreads a row-sparse tensor's rows over the servers (every worker must use the same)")
    peer_rate: float = _setting(20000.0, "GRADPRESS_PEER_RATE", "messages per second a peer may keep sending the scheduler (a server: messages it must refuse); a peer above it is cut off")
    peer_burst: int = _setting(200000, "GRADPRESS_PEER_BURST", "messages a peer may send above GRADPRESS_PEER_RATE before it is cut off")
    log_level: str = _setting("WARNING", "BYTEPS_LOG_LEVEL", "logging level: DEBUG, INFO, WARNING, ERROR")
    job_secret: str = _setting("", "GRADPRESS_JOB_SECRET", "the job's shared secret (at least 32 characters): members derive their CURVE keys from it; gradpress-launch --local makes one", secret=True)
    job_secret_file: str = _setting("", "GRADPRESS_JOB_SECRET_FILE", "file holding the job secret (surrounding whitespace ignored); instead of GRADPRESS_JOB_SECRET, not with it")
    insecure: bool = _setting(False, "GRADPRESS_INSECURE", "1: run without a job secret: no authentication, no encryption (logs a warning); the same as GRADPRESS_SECURITY=off")
    server_max_keys: int = _setting(-1, "GRADPRESS_SERVER_MAX_KEYS", "keys a server holds for the job at most (a new one past it is refused with an ERROR); -1: twice what the job declared for that server, plus 4096")
    server_max_key_bytes: int = _setting(-1, "GRADPRESS_SERVER_MAX_KEY_BYTES", "bytes of keys (their element counts times itemsize) a server holds for the job at most; -1: twice what the job declared for that server, plus 256 MiB")
    io_threads: int = _setting(-1, "GRADPRESS_IO_THREADS", "ZeroMQ I/O threads per process (each connection's bytes are encrypted on one of them); -1: with curve, one per core this process may use, 2 to 16; otherwise 2")
    server_lanes: int = _setting(-1, "GRADPRESS_SERVER_LANES", "endpoints a server listens on, each tied to one of its ZeroMQ I/O threads, the workers spread over them by rank so that their connections' encryption spreads over its cores (libzmq puts connections accepted together on one thread); a fixed GRADPRESS_SERVER_PORT P takes P to P + lanes - 1; -1: with curve, one per I/O thread (GRADPRESS_IO_THREADS), otherwise 1")
    security: str = _setting("curve", "GRADPRESS_SECURITY", "curve: members prove the job secret and every byte is encrypted (CURVE); auth: members prove the job secret when they connect, data travels unencrypted (a trusted fabric: no per-byte cost); off: neither (logs a warning)")

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"DMLC_ROLE={self.role!r}: expected one of {', '.join(ROLES)}")
        for f in dataclasses.fields(self):  # nan passes every comparison below; inf would be no deadline
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.metadata['env']}={value}: must be a finite number")
        for name in ("num_worker", "num_server", "local_size", "partition_bytes",
                     "scheduling_credit", "plan_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{_env(name)}={getattr(self, name)}: must be at least 1")
        if self.cpus < 0:
            raise ValueError(f"GRADPRESS_CPUS={self.cpus:g}: must be a count of cores, or 0 (those of this process)")
        if self.server_engine_threads < -1:
            raise ValueError(f"BYTEPS_SERVER_ENGINE_THREAD={self.server_engine_threads}: must be a count of "
                             f"threads, 0 (the I/O thread sums) or -1 (chosen by the host's cores)")
        if not 0 <= self.local_rank < self.local_size:
            raise ValueError(f"BYTEPS_LOCAL_RANK={self.local_rank}: must be in [0, BYTEPS_LOCAL_SIZE={self.local_size})")
        if not (self.worker_id == -1 or 0 <= self.worker_id < self.num_worker):
            raise ValueError(f"DMLC_WORKER_ID={self.worker_id}: must be in [0, DMLC_NUM_WORKER={self.num_worker}) or unset")
        if not (self.server_id == -1 or 0 <= self.server_id < self.num_server):
            raise ValueError(f"GRADPRESS_SERVER_ID={self.server_id}: must be in [0, DMLC_NUM_SERVER={self.num_server}) "
                             f"or unset")
        uri = self.root_uri
        if "://" in uri or (uri.count(":") == 1 and uri.rsplit(":", 1)[1].isdigit()):  # (IPv6 has two or more)
            raise ValueError(f"DMLC_PS_ROOT_URI={uri!r}: an address alone (an IP or a DNS name), the port in "
                             f"DMLC_PS_ROOT_PORT; it waited out the connect timeout for a host of that name")
        for name in ("root_port", "server_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ValueError(f"{_env(name)}={getattr(self, name)}: not a port number")
        for name in ("heartbeat_interval_s", "heartbeat_timeout_s", "connect_timeout_s", "op_timeout_s"):
            if not 0 < getattr(self, name) <= MAX_TIMEOUT_S:  # (above it, ZeroMQ's and Python's waits overflow)
                raise ValueError(f"{_env(name)}={getattr(self, name)}: seconds, more than 0 and at most "
                                 f"{MAX_TIMEOUT_S:.0f} (11 days); gradpress has no wait without a deadline")
        if self.partition_bytes > MAX_PARTITION_BYTES:
            raise ValueError(f"BYTEPS_PARTITION_BYTES={self.partition_bytes}: at most {MAX_PARTITION_BYTES} (1 GiB)")
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(f"PS_HEARTBEAT_TIMEOUT={self.heartbeat_timeout_s} must exceed "
                             f"PS_HEARTBEAT_INTERVAL={self.heartbeat_interval_s}")
        if self.peer_rate <= 0 or self.peer_burst < 1:
            raise ValueError(f"GRADPRESS_PEER_RATE={self.peer_rate} must be > 0 and "
                             f"GRADPRESS_PEER_BURST={self.peer_burst} at least 1")
        if not 0 <= self.sparse_density <= 1 or not 0 <= self.sparse_seed < 1 << 63:
            raise ValueError(f"GRADPRESS_SPARSE_DENSITY={self.sparse_density} must be in [0, 1] and "
                             f"GRADPRESS_SPARSE_SEED={self.sparse_seed} in [0, 2**63)")
        if not 0 <= self.gil_switch_us <= 1_000_000:
            raise ValueError(f"GRADPRESS_GIL_SWITCH_US={self.gil_switch_us}: microseconds from 1 to 1000000, "
                             "or 0 for Python's own")
        if self.fuse_below_bytes < 0:
            raise ValueError(f"GRADPRESS_FUSE_BELOW_BYTES={self.fuse_below_bytes}: must be >= 0 (0: no fusion)")
        if self.fuse_compressed_bytes < 0:
            raise ValueError(f"GRADPRESS_FUSE_COMPRESSED_BYTES={self.fuse_compressed_bytes}: must be >= 0 "
                             f"(0: no fusion)")
        if self.min_compress_bytes < 0:
            raise ValueError(f"BYTEPS_MIN_COMPRESS_BYTES={self.min_compress_bytes}: must be >= 0")
        for name in ("server_max_keys", "server_max_key_bytes"):  # 0 or below -1 would silently mean -1
            if getattr(self, name) == 0 or getattr(self, name) < -1:
                raise ValueError(f"{_env(name)}={getattr(self, name)}: a cap of at least 1, or -1 for the default")
        if self.job_secret and self.job_secret_file:
            raise ValueError("GRADPRESS_JOB_SECRET and GRADPRESS_JOB_SECRET_FILE are both set: set only one")
        if self.io_threads == 0 or self.io_threads < -1:
            raise ValueError(f"GRADPRESS_IO_THREADS={self.io_threads}: a count of at least 1, or -1 for the default")
        if self.server_lanes == 0 or self.server_lanes < -1 or self.server_lanes > MAX_SERVER_LANES:
            raise ValueError(f"GRADPRESS_SERVER_LANES={self.server_lanes}: a count from 1 to {MAX_SERVER_LANES}, "
                             "or -1 for the default")
        if self.server_lanes > 0 and self.io_threads > 0 and self.server_lanes > self.io_threads:
            raise ValueError(f"GRADPRESS_SERVER_LANES={self.server_lanes} is more than GRADPRESS_IO_THREADS="
                             f"{self.io_threads}: each lane is tied to one I/O thread")
        if self.security not in ("curve", "auth", "off"):
            raise ValueError(f"GRADPRESS_SECURITY={self.security!r}: expected curve, auth or off")
        if self.insecure and self.security == "auth":
            raise ValueError("GRADPRESS_INSECURE=1 and GRADPRESS_SECURITY=auth contradict each other: set one")
        off = "GRADPRESS_INSECURE=1" if self.insecure else "GRADPRESS_SECURITY=off"
        if self.insecure:  # the older spelling of off
            object.__setattr__(self, "security", "off")
        if self.security == "off" and (self.job_secret or self.job_secret_file):
            raise ValueError(f"{off} and a job secret are both set: unset {off.split('=')[0]} "
                             "to use the secret, or the secret to run insecure")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError(f"BYTEPS_LOG_LEVEL={self.log_level!r}: expected DEBUG, INFO, WARNING or ERROR")

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None, config_file: str | None = None) -> "Settings":
        """Defaults, then the TOML job file, then the environment.

        Args:
            environ: the environment to read (default ``os.environ``).
            config_file: a TOML job file; default: ``GRADPRESS_CONFIG`` from the environment.
        Raises:
            ValueError: naming the key, variable or value that is wrong.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        path = config_file or environ.get("GRADPRESS_CONFIG", "")
        if path:
            values.update(settings_from_toml(path))
            values["config_file"] = path
        for f in dataclasses.fields(cls):
            raw = environ.get(f.metadata["env"])
            if raw is not None and raw != "":
                values[f.name] = _parse(f, raw, f.metadata["env"])
        if values.get("insecure") and values.get("security") == "curve":  # (the default says nothing: here only)
            raise ValueError("GRADPRESS_INSECURE=1 and GRADPRESS_SECURITY=curve contradict each other: set one")
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        """The environment that reproduces these settings in a child process."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.metadata["env"]] = ("1" if v else "0") if isinstance(v, bool) else str(v)
        return out


def settings_from_toml(path: str) -> dict[str, Any]:
    """The ``[settings]`` table of a TOML job file, checked field by field."""
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except OSError as e:
        raise ValueError(f"config file {path}: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"config file {path}: not valid TOML: {e}") from e
    unknown_tables = set(doc) - set(CONFIG_TABLES)
    if unknown_tables:
        raise ValueError(f"config file {path}: unknown table(s) {sorted(unknown_tables)}; "
                         f"accepted: {sorted(CONFIG_TABLES)}")
    table = doc.get("settings", {})
    if not isinstance(table, dict):
        raise ValueError(f"config file {path}: [settings] must be a table")
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    values = {}
    for key, value in table.items():
        if key == "config_file":  # (the file names itself: GRADPRESS_CONFIG, or gradpress-launch --config)
            raise ValueError(f"config file {path}: config_file cannot be set in a job file; it is this file")
        if key not in fields:
            raise ValueError(f"config file {path}: unknown setting {key!r}; accepted: "
                             f"{', '.join(sorted(set(fields) - {'config_file'}))}")
        values[key] = _check_type(fields[key], value, f"config file {path}: {key}")
    return values


# Settings every worker of a job must give alike: they decide which keys a tensor makes and
# which tensors travel together, so a worker apart failed only at a deadline, naming a tensor
# of gradpress's own (``Gradient.small-fused.c48965b0``). A worker registers with them.
WORKERS_AGREE = ("partition_bytes", "min_compress_bytes", "fuse_below_bytes", "fuse_compressed_bytes",
                 "sparse_density", "sparse_seed", "plan_steps")


def agreed(settings: Settings) -> dict[str, Any]:
    """This worker's values of WORKERS_AGREE, by environment variable."""
    return {_env(name): getattr(settings, name) for name in WORKERS_AGREE}


# Tables a job file may hold; other modules (compression rules) read their own table.
CONFIG_TABLES = ("settings", "compression")


def _env(name: str) -> str:
    return {f.name: f.metadata["env"] for f in dataclasses.fields(Settings)}[name]


def _parse(f: dataclasses.Field, raw: str, where: str) -> Any:
    typ = f.type if isinstance(f.type, type) else {"int": int, "float": float, "bool": bool, "str": str}[f.type]
    try:
        if typ is bool:
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        return typ(raw)
    except ValueError:
        raise ValueError(f"{where}={raw!r}: expected {typ.__name__}") from None


def _check_type(f: dataclasses.Field, value: Any, where: str) -> Any:
    typ = {"int": int, "float": float, "bool": bool, "str": str}[f.type] if isinstance(f.type, str) else f.type
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is int and isinstance(value, bool) or not isinstance(value, typ):
        raise ValueError(f"{where} = {value!r}: expected {typ.__name__}")
    return value


def setting_docs() -> list[tuple[str, str, Any, str]]:
    """(environment name, field name, default, meaning) of every setting, for docs/env.md."""
    return [(f.metadata["env"], f.name, f.default, f.metadata["doc"]) for f in dataclasses.fields(Settings)]


def env_table_markdown() -> str:
    """The settings table of docs/env.md (``python -m gradpress.config`` prints it)."""
    rows = [f"| `{env}` | `{name}` | `{default!r}` | {doc} |" for env, name, default, doc in setting_docs()]
    return "\n".join(["| environment | job file key | default | meaning |", "| --- | --- | --- | --- |"] + rows)


if __name__ == "__main__":
    print(env_table_markdown())
