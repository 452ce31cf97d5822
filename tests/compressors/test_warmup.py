"""gradpress/compressors/warmup.py: every kernel a node may call is loaded before it registers."""


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
