"""The rule behind ``pytest -m "not integ"``: a test that starts a process is marked ``integ``.

``needs_integ_marker`` is an autouse fixture (conftest.py): an unmarked test that starts a
process (``subprocess.Popen``, or a ``multiprocessing`` process) fails, naming what it
started."""
from __future__ import annotations

import multiprocessing.process
import os
import subprocess

LIBRARY_LOOKUPS = {"ldconfig", "gcc", "cc", "ld", "objdump"}  # what ctypes.util.find_library runs


def needs_integ_marker(request, monkeypatch):
    if request.node.get_closest_marker("integ") is not None:
        yield
        return
    started = []
    real_popen, real_start = subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start

    def popen(self, args, *rest, **kwargs):
        argv = args.split() if isinstance(args, str) else [str(a) for a in args]
        if not argv or os.path.basename(argv[0]) not in LIBRARY_LOOKUPS:
            started.append(" ".join(argv)[:120])
        return real_popen(self, args, *rest, **kwargs)

    def start(self):
        started.append(f"multiprocessing: {self.name}")
        return real_start(self)
    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    yield
    assert not started, (f"{request.node.nodeid} starts processes ({started[:2]}) but is not marked "
                         f"integ: add @pytest.mark.integ (or pytestmark)")
