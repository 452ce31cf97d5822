"""The rule behind ``pytest -m "not integ"``: a test that starts a process is marked ``integ``.

``needs_integ_marker`` is an autouse fixture (conftest.py): an unmarked test that starts a
process (``subprocess.Popen``, or a ``multiprocessing`` process) fails, naming what it
started."""
from __future__ import annotations

import multiprocessing.process
import subprocess


def needs_integ_marker(request, monkeypatch):
    if request.node.get_closest_marker("integ") is not None:
        yield
        return
    started = []
    real_popen, real_start = subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start

    def popen(self, args, *rest, **kwargs):
        started.append(args if isinstance(args, str) else " ".join(map(str, args))[:120])
        return real_popen(self, args, *rest, **kwargs)

    def start(self):
        started.append(f"multiprocessing: {self.name}")
        return real_start(self)
    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    yield
    assert not started, (f"{request.node.nodeid} starts processes ({started[:2]}) but is not marked "
                         f"integ: add @pytest.mark.integ (or pytestmark)")
