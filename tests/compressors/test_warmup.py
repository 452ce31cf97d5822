"""gradpress/compressors/warmup.py: every kernel a node may call is loaded before it registers."""


def test_warm_up_runs_every_codec_for_both_roles():
    from gradpress.compressors import COMPRESSORS
    from gradpress.compressors.warmup import _CONFIGS, warm_up
    assert {c["compressor"] for c in _CONFIGS} | {"none"} == set(COMPRESSORS), "a codec is missing from warm-up"
    for role in ("worker", "server"):
        assert warm_up(role) >= 0
