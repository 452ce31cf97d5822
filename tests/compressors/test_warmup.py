"""gradpress/compressors/warmup.py: every kernel a node may call is compiled before it
registers; once numba's cache holds them all, a node skips the warm-up."""
import json

import numba
import pytest
from numba.core import caching

from gradpress.compressors import warmup


@pytest.fixture
def manifest(tmp_path, monkeypatch):
    """The warm-up's list of kernels in a directory of the test's own."""
    monkeypatch.setattr(warmup, "_manifest_path", lambda role: str(tmp_path / f"warm-{role}.json"))
    return lambda role: tmp_path / f"warm-{role}.json"


def test_warm_up_runs_every_codec_for_both_roles(monkeypatch, manifest):
    import gradpress.compressors as compressors
    from gradpress.compressors import COMPRESSORS
    assert {c["compressor"] for c in warmup._CONFIGS} | {"none"} == set(COMPRESSORS), "a codec is missing from warm-up"
    built, real = [], compressors.build_compressor

    def recording(params, role):
        built.append((params["compressor"], role))
        return real(params, role)
    monkeypatch.setattr(compressors, "build_compressor", recording)
    for role in ("worker", "server"):
        assert warmup.warm_up(role) > 0  # no list yet: the full warm-up
    assert set(built) == {(c["compressor"], role) for c in warmup._CONFIGS for role in ("worker", "server")}


def test_a_warm_up_lists_its_kernels_and_the_next_node_skips_it(monkeypatch, manifest):
    assert not warmup.cached("worker")
    warmup.warm_up("worker", force=True)
    listed = json.loads(manifest("worker").read_text())
    assert listed["numba"] == numba.__version__
    for kernel in ("onebit:_pack_feedback", "topk:topk_feedback", "randomk:gather_feedback", "dithering:encode"):
        assert f"gradpress.kernels.cpu.{kernel}" in listed["kernels"], listed
    assert warmup.cached("worker") and not warmup.cached("server")

    import gradpress.compressors as compressors
    monkeypatch.setattr(compressors, "build_compressor", lambda *a: pytest.fail("a skipped warm-up built a codec"))
    assert warmup.warm_up("worker") == 0.0


@pytest.mark.parametrize("spoil", ["missing", "corrupt", "another numba", "empty", "unknown kernel", "stale source"])
def test_a_list_that_cannot_be_trusted_means_a_full_warm_up(monkeypatch, manifest, spoil):
    warmup.warm_up("worker", force=True)
    path = manifest("worker")
    listed = json.loads(path.read_text())
    if spoil == "missing":
        path.unlink()
    elif spoil == "corrupt":
        path.write_text(path.read_text()[:40])
    elif spoil == "another numba":
        path.write_text(json.dumps({**listed, "numba": "0.1.0"}))
    elif spoil == "empty":
        path.write_text(json.dumps({**listed, "kernels": []}))
    elif spoil == "unknown kernel":
        path.write_text(json.dumps({**listed, "kernels": listed["kernels"] + ["gradpress.kernels.cpu.onebit:gone"]}))
    else:  # a kernel's source edited since: numba's index for it no longer matches
        monkeypatch.setattr(caching.IndexDataCacheFile, "_load_index", lambda self: {})
    assert not warmup.cached("worker")
    assert warmup.warm_up("worker") > 0
