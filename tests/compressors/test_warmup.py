"""gradpress/compressors/warmup.py: every kernel a node may call is loaded before it registers."""
import subprocess
import sys

import pytest


def test_warm_up_runs_every_codec_for_both_roles(monkeypatch):
    import gradpress.compressors as compressors
    from gradpress.compressors import COMPRESSORS
    from gradpress.compressors.warmup import _CONFIGS, warm_up
    assert {c["compressor"] for c in _CONFIGS} | {"none"} == set(COMPRESSORS), "a codec is missing from warm-up"
    built, real = [], compressors.build_compressor

    def recording(params, role):
        built.append((params["compressor"], role))
        return real(params, role)
    monkeypatch.setattr(compressors, "build_compressor", recording)
    for role in ("worker", "server"):
        assert warm_up(role) > 0
    assert set(built) == {(c["compressor"], role) for c in _CONFIGS for role in ("worker", "server")}


@pytest.mark.integ
def test_a_workers_warm_up_loads_what_its_communication_thread_calls_without_a_codec():
    """Its machine's sums (local reduction) and a float16 average: loaded at their first call
    instead, they hold that thread, and its heartbeats, for numba's set-up (a job of 6 workers
    on 2 cores lost one at PS_HEARTBEAT_TIMEOUT=2 when every kernel loaded that way)."""
    script = ("from gradpress.compressors.warmup import warm_up; warm_up('worker')\n"
              "from gradpress.kernels.cpu import fp16, server_sum\n"
              "divide = fp16._divide_hardware if fp16.HARDWARE_HALF else fp16._divide_software\n"
              "print(len(server_sum._add.signatures), len(server_sum._store.signatures), len(divide.signatures),\n"
              "      len(server_sum._pair.signatures))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    add, store, divide, pair = (int(n) for n in out.stdout.split())
    # float32 and float64, each from a read-only frame and from writable shared memory; the pair
    # sum (an uncompressed key's first two contributions) in every mix of the two
    assert (add, store, pair) == (4, 4, 8) and divide > 0, out.stdout
