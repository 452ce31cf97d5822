"""``gradpress-launch``: start a role, or a whole job on this machine.

As BytePS's ``bpslaunch``: with ``DMLC_ROLE=scheduler`` or ``server`` it runs that
role in this process; with ``DMLC_ROLE=worker`` it runs the given command once per
visible GPU (once on a CPU machine) with ``BYTEPS_LOCAL_RANK``/``BYTEPS_LOCAL_SIZE``
set. ``--local`` starts scheduler, servers and workers on 127.0.0.1, prefixes their
output with role and rank, and stops everything as soon as one process fails. Each of its
workers is a machine of its own (local rank 0): on a machine with several GPUs, worker *i*
sees the *i*-th of them alone, round robin (``CUDA_VISIBLE_DEVICES``).
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time

from . import host, logs
from .config import MAX_LOCAL_SIZE, Settings
from .net import auth
from .processes import ProcessGroup, Terminated, raise_on_termination

# Runs the role DMLC_ROLE names (scheduler or server) in a process of its own.
ROLE_COMMAND = [sys.executable, "-m", "gradpress.launcher"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gradpress-launch", description=__doc__.split("\n\n")[1])
    p.add_argument("--config", help="TOML job file (the environment overrides it)")
    p.add_argument("--local", action="store_true", help="run a whole job on this machine")
    p.add_argument("--workers", type=int, help="--local: number of workers (default 2)")
    p.add_argument("--servers", type=int, help="--local: number of servers (default 1)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the worker command (after --)")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.config:
        os.environ["GRADPRESS_CONFIG"] = os.path.abspath(args.config)
    try:
        settings = Settings.load()
        if settings.config_file:  # its [compression] too, before any process starts (else only the
            # workers' optimizers read it, once scheduler and servers are up); imported here, for the
            # codecs load Numba: 0.3 s of a core in each process started, a job's scheduler among them
            from .compressors.policy import CompressionPolicy
            CompressionPolicy.from_job_file(settings.config_file, settings.min_compress_bytes)
    except ValueError as e:
        print(f"gradpress-launch: {e}", file=sys.stderr)
        return 2
    if not args.local and (args.workers, args.servers) != (None, None):  # else silently the environment's
        p.error("--workers and --servers size a --local job; a job started by hand takes DMLC_NUM_WORKER and "
                "DMLC_NUM_SERVER")
    if args.local:
        workers, servers = 2 if args.workers is None else args.workers, 1 if args.servers is None else args.servers
        if not command:
            p.error("--local needs a worker command after --")
        if workers < 1 or servers < 1:
            p.error("--workers and --servers must be at least 1")
        if max(workers, servers) > MAX_LOCAL_SIZE:  # (before spawning them: registration refuses them later)
            p.error(f"--workers {workers} --servers {servers}: a --local job runs on this machine, at most "
                    f"{MAX_LOCAL_SIZE} of each")
        raise_on_termination()
        return run_local(command, workers, servers)
    logs.configure(settings.log_level)
    try:
        auth.job_keys(settings)  # a by-hand start without a secret stops here, saying what to set
    except auth.JobSecretError as e:
        print(f"gradpress-launch: DMLC_ROLE={settings.role}: {e}", file=sys.stderr)
        return 2
    if not command and settings.role == "worker":
        p.error("DMLC_ROLE=worker needs the training command to run")
    raise_on_termination()
    return serve(settings) if settings.role in ("scheduler", "server") else run_workers(command, settings)


def serve(settings: Settings) -> int:
    """This process is the scheduler or a server until the job ends. At its end ZeroMQ
    delivers what its sockets still queue (``transport.deliver_queued``), and the exit skips
    Python's final collections (``exit_gc``)."""
    from . import exit_gc
    from .net import transport
    exit_gc.configure(settings)
    if settings.role == "scheduler":
        from .scheduler import Scheduler as Node
    else:
        from .server import Server as Node
    node = Node(settings)
    try:
        return node.run()  # (a server tells the scheduler it was stopped, as any failure of its)
    except Terminated as e:
        print(f"gradpress-launch: {settings.role}: {e}", file=sys.stderr)
        return e.status
    except KeyboardInterrupt:  # Ctrl-C reaches every process of the terminal's job: one line, no traceback
        print(f"gradpress-launch: {settings.role}: interrupted", file=sys.stderr)
        return 130
    finally:
        try:
            transport.deliver_queued(node.ctx)
        except (Terminated, KeyboardInterrupt):  # told again to stop: no more grace (nor a second traceback)
            pass


def run_workers(command: list[str], settings: Settings) -> int:
    """One process per visible GPU (one on a CPU machine), with local rank and size set."""
    local_size = int(os.environ["BYTEPS_LOCAL_SIZE"]) if os.environ.get("BYTEPS_LOCAL_SIZE") else _visible_gpus()
    if not 1 <= local_size <= MAX_LOCAL_SIZE:  # (before spawning them)
        print(f"gradpress-launch: BYTEPS_LOCAL_SIZE={local_size} is not in [1, {MAX_LOCAL_SIZE}]", file=sys.stderr)
        return 2
    group = ProcessGroup()
    for r in range(local_size):
        env = dict(os.environ, BYTEPS_LOCAL_RANK=str(r), BYTEPS_LOCAL_SIZE=str(local_size),
                   **_thread_share(local_size, cpus=settings.cpus))
        group.start(f"worker {settings.worker_id}.{r}" if local_size > 1 else "worker", command, env,
                    prefix=local_size > 1)
    return group.wait(essential=group.names)


def run_local(command: list[str], workers: int, servers: int) -> int:
    """A whole job on 127.0.0.1: scheduler on a free port, then servers, then workers."""
    job = LocalJob(workers, servers)
    with tempfile.TemporaryDirectory(prefix="gradpress-") as tmp:
        try:
            job.start(command, os.path.join(tmp, "port"))
        except (RuntimeError, OSError, Terminated) as e:  # (Terminated: while it started)
            print(f"gradpress-launch: {e}", file=sys.stderr)
            job.group.stop()
            return getattr(e, "status", 1)
        return job.group.wait(essential=[n for n in job.group.names if n.startswith("worker")])


class LocalJob:
    """The processes of one job on 127.0.0.1, started in order into one ProcessGroup.

    ``run_local`` starts a whole job at once; tests start the pieces one by one.

    Args:
        workers: number of worker processes (one per worker machine, local size 1).
        servers: number of server processes.
        environ: the environment every process starts from (default: this process's).
        group: the group the processes join (default: one that prefixes their output here).
    """

    def __init__(self, workers: int, servers: int, environ: dict[str, str] | None = None,
                 group: ProcessGroup | None = None):
        environ = dict(os.environ if environ is None else environ)
        self.workers, self.servers = workers, servers
        self.group = group or ProcessGroup()
        self.env = dict(environ, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_NODE_HOST="127.0.0.1",
                        DMLC_NUM_WORKER=str(workers), DMLC_NUM_SERVER=str(servers), PYTHONUNBUFFERED="1",
                        **_thread_share(workers, environ), **auth.secret_env(environ))
        self.port = 0

    def start(self, command: list[str], port_file: str) -> None:
        """Scheduler, then every server, then every worker running ``command``."""
        self.start_scheduler(port_file)
        for i in range(self.servers):
            self.start_server(i)
        for i in range(self.workers):
            self.start_worker(i, command, **_gpu_of(i, self.env))

    def start_scheduler(self, port_file: str) -> int:
        """The scheduler on a free port. Returns the port once the scheduler wrote it to ``port_file``.

        Raises:
            RuntimeError: the scheduler exited or did not report a port in time.
        """
        self.group.start("scheduler", ROLE_COMMAND, dict(self.env, DMLC_ROLE="scheduler", DMLC_PS_ROOT_PORT="0",
                                                         GRADPRESS_PORT_FILE=port_file))
        self.port = _wait_for_port(port_file, self.group)
        self.env["DMLC_PS_ROOT_PORT"] = str(self.port)
        return self.port

    def start_server(self, index: int, **env: str) -> None:
        # its rank is ``index`` too: the label on its lines and its name in every log agree
        self.group.start(f"server {index}", ROLE_COMMAND, {**self.env, "DMLC_ROLE": "server",
                                                           "GRADPRESS_SERVER_ID": str(index), **env})

    def start_worker(self, index: int, command: list[str], **env: str) -> None:
        self.group.start(f"worker {index}", command, {**self.env, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(index),
                                                      "BYTEPS_LOCAL_RANK": "0", "BYTEPS_LOCAL_SIZE": "1", **env})


def _wait_for_port(path: str, group: ProcessGroup, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as fh:
                return int(fh.read())
        if group.procs["scheduler"].poll() is not None:
            raise RuntimeError(f"the scheduler exited with code {group.procs['scheduler'].returncode} before listening")
        time.sleep(0.05)
    raise RuntimeError(f"the scheduler did not report its port within {timeout_s:g} s")


def _thread_share(processes: int, environ: dict[str, str] | None = None, cpus: float = 0.0) -> dict[str, str]:
    """Each of ``processes`` workers gets its share of the cores for torch's intra-op threads.

    Left alone, every worker starts one OpenMP thread per core and they fight: on 2 cores
    with 2 workers the digits demo ran 6x slower. As torchrun does, an explicit
    OMP_NUM_THREADS from the user wins. The cores are ``cpus`` (GRADPRESS_CPUS, a pod's CPU
    request, as the settings read it: the job file's too), else the environment's, else those
    this process may use.
    """
    environ = os.environ if environ is None else environ
    if "OMP_NUM_THREADS" in environ:
        return {}
    cores = cpus or float(environ.get("GRADPRESS_CPUS") or 0) or host.cores()  # (checked by Settings.load)
    return {"OMP_NUM_THREADS": str(max(1, int(cores) // processes))}


def _gpu_of(index: int, environ: dict[str, str]) -> dict[str, str]:
    """``--local``'s worker ``index``: one of the visible GPUs, round robin, where there are
    several. Each worker is a machine of its own there, local rank 0, so a script that picks
    ``cuda:local_rank`` (BytePS's examples) would put every worker on the first GPU. Without
    ``CUDA_VISIBLE_DEVICES`` the GPUs are counted only where ``/dev/nvidia<N>`` exists, so
    that a CPU machine's launcher does not import torch."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        ids = [d.strip() for d in value.split(",") if d.strip()]
    elif glob.glob("/dev/nvidia[0-9]*"):
        ids = [str(d) for d in range(_visible_gpus(environ))]
    else:
        ids = []
    return {"CUDA_VISIBLE_DEVICES": ids[index % len(ids)]} if len(ids) > 1 else {}


def _visible_gpus(environ: dict[str, str] | None = None) -> int:
    for var in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        value = (os.environ if environ is None else environ).get(var)
        if value is not None and value not in ("all", "void"):
            return max(1, len([d for d in value.split(",") if d.strip()]))
    try:
        import torch
        return max(1, torch.cuda.device_count())
    except Exception:
        return 1


if __name__ == "__main__":
    sys.exit(main())
