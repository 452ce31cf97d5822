"""BytePS modes and settings that gradpress does not implement: refused at ``init()``.

A BytePS job script or launch environment that asks for one of these would otherwise
run with a different meaning than the user expects; ``check(settings)`` names the
setting instead. Settings that only tune BytePS's own C++ internals (NCCL rings, NUMA,
CPU pinning) change no result and are left alone.
"""
from __future__ import annotations

import os
import tomllib
from typing import Mapping

from ..config import Settings

# environment variable -> why gradpress refuses it when it is set to anything but 0/empty
UNSUPPORTED = {
    "DMLC_ENABLE_RDMA": "RDMA transport (gradpress speaks ZeroMQ over TCP)",
    "BYTEPS_ENABLE_RDMA": "RDMA transport (gradpress speaks ZeroMQ over TCP)",
    "DMLC_ENABLE_UCX": "UCX transport (gradpress speaks ZeroMQ over TCP)",
    "BYTEPS_ENABLE_MIXED_MODE": "mixed mode (BytePS's split of server work between worker and CPU machines)",
    "BYTEPS_SERVER_ENABLE_SCHEDULE": "server-side scheduling of pushes",
    "BYTEPS_ENABLE_GDB": "starting BytePS processes under gdb",
}


def check(settings: Settings, environ: Mapping[str, str] | None = None) -> None:
    """Raise ValueError naming the first unsupported mode this job asks for."""
    environ = os.environ if environ is None else environ
    for var, what in UNSUPPORTED.items():
        value = environ.get(var, "").strip()
        if value not in ("", "0", "false", "False"):
            raise ValueError(f"{var}={value!r}: {what} is not implemented by gradpress; unset it")
    if settings.enable_async and settings.config_file:
        with open(settings.config_file, "rb") as fh:
            if tomllib.load(fh).get("compression"):
                raise ValueError(f"BYTEPS_ENABLE_ASYNC=1 with a [compression] table in {settings.config_file}: "
                                 f"asynchronous training pushes uncompressed parameter deltas only")
