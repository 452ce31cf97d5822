"""The job of the ``namespaces`` fixture (tests/conftest.py): a scheduler, one server and two
workers, each in its own namespace, started by the netns tests."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from cluster import FAST

REPO = Path(__file__).resolve().parents[2]


def start_job(namespaces, worker_argv: list[str], tmp: Path, env: dict[str, str]) -> dict:
    """Every node's process, by node name (sched, s0, w0, w1); each one's output in
    ``tmp/<name>.log``. ``env`` comes on top of the job's settings (FAST's deadlines, no
    shared memory: the nodes are apart)."""
    common = {**os.environ, **FAST, "DMLC_PS_ROOT_URI": namespaces.addr("sched"), "DMLC_PS_ROOT_PORT": "9431",
              "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1", "GRADPRESS_SHM": "0", "GP_TEST_DIR": str(tmp),
              "PYTHONPATH": str(REPO), **env}
    role = [sys.executable, "-m", "gradpress.launcher"]
    nodes = [("sched", role, {"DMLC_ROLE": "scheduler"}), ("s0", role, {"DMLC_ROLE": "server"})]
    nodes += [(f"w{i}", worker_argv, {"DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(i)}) for i in range(2)]
    return {name: namespaces.popen(name, argv, {**common, **node, "DMLC_NODE_HOST": namespaces.addr(name)},
                                   tmp / f"{name}.log", cwd=str(REPO)) for name, argv, node in nodes}
