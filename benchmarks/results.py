"""What a benchmark measured: printed, and kept as a record when asked.

Every benchmark ends with one call::

    results.emit("pushpull", result)

It prints ``RESULT {json}`` as the last line, as the benchmarks always have. Where the
environment names a folder in ``GRADPRESS_RESULTS_DIR``, it also writes the result there as
a JSON record, ``<folder>/<name>-<UTC date>.json``, with the date, the git commit (and
the tracked files changed since it), the exact command line, the gradpress, BytePS
and DMLC settings in the environment (the job secret left out) and the machine: CPU
model, cores, memory and GPUs.

``benchmarks/results/<table>/`` holds the records in git, one folder per table of
docs/performance.md; ``benchmarks/perf_tables.py`` writes each table from the latest
record in its folder.

A benchmark that reports from a child process (a worker under ``gradpress-launch``) starts
it with ``child_env()`` in its environment, so the record names the command the user ran.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

RESULTS_DIR_ENV = "GRADPRESS_RESULTS_DIR"
COMMAND_ENV = "GRADPRESS_RESULTS_COMMAND"   # a parent's command and settings, for the child that emits
SETTINGS_ENV = "GRADPRESS_RESULTS_SETTINGS"
REPO = Path(__file__).resolve().parent.parent
SCHEMA = 1
# settings that change what a run measures; none of them is a secret
SETTING_PREFIXES = ("GRADPRESS_", "BYTEPS_", "DMLC_", "PS_", "OMP_NUM_THREADS", "NUMBA_")
NOT_RECORDED = ("SECRET", "GRADPRESS_RESULTS_")


def emit(name: str, result: dict) -> Path | None:
    """Print ``RESULT {json}``; where ``GRADPRESS_RESULTS_DIR`` is set, also write the record.

    Args:
        name: the benchmark's name (its file's stem, or the stem and its mode).
        result: what it measured, JSON-serialisable.

    Returns:
        The record's path, or None where none was asked for.
    """
    print("RESULT " + json.dumps(result), flush=True)
    folder = os.environ.get(RESULTS_DIR_ENV)
    if not folder:
        return None
    path = write(record(name, result), Path(folder))
    print(f"result record: {path}", file=sys.stderr, flush=True)  # RESULT stays the last line
    return path


def child_env() -> dict[str, str]:
    """Environment entries for a child process that will call ``emit`` for this command: its
    record then names this command and this process's settings, not the child's."""
    return {COMMAND_ENV: os.environ.get(COMMAND_ENV) or command(),
            SETTINGS_ENV: os.environ.get(SETTINGS_ENV) or json.dumps(settings_env())}


def command() -> str:
    """This process's command line, as the shell would take it."""
    return shlex.join([sys.executable, *sys.argv])


def record(name: str, result: dict, *, now: dt.datetime | None = None) -> dict:
    """The record of one run: the result with its date, commit, command and machine."""
    now = now or dt.datetime.now(dt.timezone.utc)
    commit, changed = git_state()
    return {
        "schema": SCHEMA,
        "benchmark": name,
        "source": "run",
        "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit,
        "changed_files": changed,
        "command": os.environ.get(COMMAND_ENV) or command(),
        "environment": json.loads(os.environ[SETTINGS_ENV]) if SETTINGS_ENV in os.environ else settings_env(),
        "machine": machine(),
        "result": result,
    }


def write(rec: dict, folder: Path) -> Path:
    """Write ``rec`` into ``folder`` under a name that sorts by date; never over another."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = rec["date"].replace("-", "").replace(":", "")
    path = folder / f"{rec['benchmark']}-{stamp}.json"
    n = 1
    while path.exists():
        n += 1
        path = folder / f"{rec['benchmark']}-{stamp}-{n}.json"
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return path


def settings_env() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(SETTING_PREFIXES) and not any(word in k for word in NOT_RECORDED)}


def git_state() -> tuple[str | None, list[str] | None]:
    """The tree's HEAD commit and the tracked files that differ from it (None, None without git)."""
    try:
        head = _git("rev-parse", "HEAD").strip()
        status = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None, None
    return head, [line[3:] for line in status.splitlines() if line.strip()]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True,
                          timeout=30).stdout


def machine() -> dict:
    """CPU model, cores (all, and those this process may run on), memory in GiB and GPUs."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": _memory_gib(),
        "gpus": gpus(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2 ** 20, 1)
    except OSError:
        pass
    return None


def gpus() -> list[str]:
    """The GPUs' names and memory: from torch where it is imported and sees CUDA, else nvidia-smi."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return [f"{torch.cuda.get_device_name(i)}, "
                f"{torch.cuda.get_device_properties(i).total_memory / 2 ** 30:.0f} GiB"
                for i in range(torch.cuda.device_count())]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def load(path: Path) -> dict:
    """A record from its file."""
    return json.loads(Path(path).read_text())


def latest(folder: Path) -> tuple[Path, dict]:
    """The record in ``folder`` with the latest date (its file name breaks a tie)."""
    found = [(when(rec), p.name, p, rec) for p in Path(folder).glob("*.json") for rec in [load(p)]]
    if not found:
        raise FileNotFoundError(f"no result records in {folder}")
    _, _, path, rec = max(found, key=lambda t: t[:2])
    return path, rec


def when(rec: dict) -> dt.datetime:
    """A record's date as a UTC datetime; a record transcribed with only a day or a minute
    counts from the start of it."""
    text = rec["date"].removesuffix("Z")
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d"):
        try:
            return dt.datetime.strptime(text, fmt).replace(tzinfo=dt.timezone.utc)
        except ValueError:
            continue
    raise ValueError(f"record date {rec['date']!r}: expected YYYY-MM-DD[THH:MM[:SS]]Z")
