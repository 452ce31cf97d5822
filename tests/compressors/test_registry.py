"""build_compressor: names, composition per role, and errors that list what is accepted."""
import pytest

from gradpress.compressors import COMPRESSORS, ErrorFeedback, Momentum, build_compressor
from gradpress.compressors.dithering import Dithering
from gradpress.compressors.onebit import OneBit
from gradpress.compressors.randomk import RandomK
from gradpress.compressors.topk import TopK


def test_every_codec_of_the_design_is_registered():
    assert set(COMPRESSORS) == {"onebit", "topk", "randomk", "dithering", "fp16", "none"}


def test_worker_gets_momentum_around_error_feedback_and_server_never_momentum():
    params = {"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov", "mu": 0.8,
              "scaling": True}
    worker = build_compressor(params, "worker")
    assert isinstance(worker, Momentum) and worker.mu == 0.8
    assert isinstance(worker.inner, ErrorFeedback) and not worker.inner.corrected
    assert isinstance(worker.inner.inner, OneBit) and worker.inner.inner.scaling == "l1"
    server = build_compressor(params, "server")
    assert isinstance(server, ErrorFeedback) and isinstance(server.inner, OneBit)
    assert worker.name == server.name == "onebit"


def test_defaults_and_byteps_spellings():
    assert isinstance(build_compressor({}, "worker"), type(COMPRESSORS["none"]()))
    assert build_compressor({"compressor": "topk", "k": "0.05"}, "server").k == 0.05
    dither = build_compressor({"compressor": "dithering", "k": 3, "partition": "natural",
                               "normalize": "l2", "seed": "11"}, "server")
    assert isinstance(dither, Dithering)
    assert (dither.s, dither.partition, dither.normalize, dither.seed) == (3, "natural", "l2", 11)
    randomk = build_compressor({"compressor": "randomk", "k": 10, "scaling": "true"}, "worker")
    assert isinstance(randomk, RandomK) and randomk.scaling and randomk.k == 10
    corrected = build_compressor({"compressor": "topk", "ef": "corrected"}, "worker")
    assert isinstance(corrected, ErrorFeedback) and corrected.corrected
    assert isinstance(corrected.inner, TopK) and corrected.inner.k == 0.01
    assert build_compressor({"compressor": "onebit", "momentum": "nesterov"}, "worker").mu == 0.9


@pytest.mark.parametrize("params, role, listed", [
    ({"compressor": "twobit"}, "worker", "dithering, fp16, none, onebit, randomk, topk"),
    ({"compressor": "onebit", "ef": "fancy"}, "worker", "vanilla, corrected"),
    ({"compressor": "onebit", "momentum": "heavy"}, "worker", "nesterov"),
    ({"compressor": "onebit", "scaling": "maybe"}, "worker", "true or false"),
    ({"compressor": "topk", "k": 0}, "worker", "fraction in (0, 1) or a whole count"),
    ({"compressor": "topk", "k": 2.5}, "worker", "fraction in (0, 1) or a whole count"),
    ({"compressor": "topk", "k": "lots"}, "worker", "a number in"),
    ({"compressor": "dithering", "s": 0}, "worker", "an integer in [1, 127]"),
    ({"compressor": "dithering", "s": 500}, "worker", "an integer in [1, 127]"),
    ({"compressor": "dithering", "partition": "log"}, "worker", "linear, natural"),
    ({"compressor": "dithering", "normalize": "l1"}, "worker", "max, l2"),
    ({"compressor": "dithering", "s": 3, "k": 5}, "worker", "both s=3 and k=5 (BytePS's name for s)"),
    ({"compressor": "randomk", "seed": -1}, "worker", "an integer in"),
    ({"compressor": "onebit", "momentum": "nesterov", "mu": 1.5}, "worker", "a number in [0,"),
    ({"compressor": "topk", "s": 3}, "worker", "accepted: compressor, ef, k, momentum, mu"),
    ({"compressor": "onebit"}, "scheduler", "worker, server"),
])
def test_bad_params_raise_value_error_listing_accepted_values(params, role, listed):
    with pytest.raises(ValueError) as error:
        build_compressor(params, role)
    assert listed in str(error.value)


def test_registering_a_taken_name_fails():
    from gradpress.compressors.registry import register
    with pytest.raises(ValueError, match="registered twice"):
        register(type("Again", (), {"name": "onebit"}))
