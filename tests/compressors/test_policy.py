"""gradpress/compressors/policy.py: which tensors get which compression, checked once as a CodecSpec."""
import pytest

from gradpress.compressors.policy import CompressionPolicy

ONEBIT = {"compressor": "onebit", "ef": "vanilla"}
TOPK = {"compressor": "topk", "k": 0.01}


def params(policy: CompressionPolicy, name: str, nbytes: int, dtype: str) -> dict | None:
    spec = policy.for_tensor(name, nbytes, dtype)
    return None if spec is None else spec.compression_params


def test_a_spec_is_frozen_and_carries_the_users_dict_unchanged():
    spec = CompressionPolicy(ONEBIT).default
    assert spec.codec == "onebit" and spec.compression_params == ONEBIT
    with pytest.raises(AttributeError):
        spec.codec = "topk"
    assert CompressionPolicy({"compressor": "none"}).default is None


def test_rules_first_match_then_default_then_size_and_dtype():
    p = CompressionPolicy(ONEBIT, [("*.bias", {"compressor": "none"}), ("fc*", TOPK), ("fc1.*", ONEBIT)],
                          min_bytes=1000)
    assert params(p, "conv1.weight", 4000, "float32") == ONEBIT
    assert params(p, "fc1.weight", 4000, "float32") == TOPK  # first match wins
    assert p.for_tensor("fc1.bias", 4000, "float32") is None
    assert p.for_tensor("conv1.weight", 999, "float32") is None  # below BYTEPS_MIN_COMPRESS_BYTES
    assert p.for_tensor("conv1.weight", 4000, "float64") is None  # float32, and half precision widened
    assert p.for_tensor("conv1.weight", 4000, "int64") is None
    assert params(p, "conv1.weight", 4000, "float16") == params(p, "conv1.weight", 4000, "bfloat16") == ONEBIT
    assert CompressionPolicy().for_tensor("x", 10**6, "float32") is None


def test_code_overrides_the_job_file(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text('[compression.default]\ncompressor = "onebit"\n\n[[compression.rules]]\npattern = "emb*"\n'
                 'compressor = "topk"\nk = 0.1\n')
    file_policy = CompressionPolicy.from_job_file(str(f), 0)
    assert params(file_policy, "emb.weight", 100, "float32") == {"compressor": "topk", "k": 0.1}
    assert params(file_policy, "fc.weight", 100, "float32") == {"compressor": "onebit"}
    both = file_policy.overridden_by(TOPK, [("fc*", ONEBIT)])
    assert params(both, "fc.weight", 100, "float32") == ONEBIT
    assert params(both, "other", 100, "float32") == TOPK
    assert params(both, "emb.weight", 100, "float32") == {"compressor": "topk", "k": 0.1}


@pytest.mark.parametrize("default,rules,match", [
    ({"compressor": "gzip"}, None, "gzip.*accepted"),
    (None, [("x", {"compressor": "topk", "k": -1})], "rule 'x'"),
    ("onebit", None, "expected a dict"),
    # a name that is no codec's, all of them listed (low-rank and auto too); a number past a float's range
    ({"compressor": None}, None, r"\['compressor'\] = None; accepted: acpsgd, auto, dithering"),
    ({"compressor": "powersdg"}, None, "accepted: acpsgd, auto, dithering, fp16, none, onebit, powersgd"),
    ({"compressor": "topk", "k": 10 ** 400}, None, r"\['k'\] = 1000.*accepted: a number"),
    # worker state with nothing to act on: momentum or error feedback on the raw path
    ({"compressor": "none", "momentum": "nesterov"}, None, "momentum need a codec, but compressor is 'none'"),
    (None, [("x", {"ef": "vanilla", "momentum": "nesterov"})], "rule 'x'.*ef and momentum need a codec"),
    # rules of the wrong shape: a dict of them, a pattern that is not a string
    (None, {"*.bias": {"compressor": "none"}}, r"got a dict: pass list\(rules.items\(\)\)"),
    (None, [(None, {"compressor": "none"})], r"compression_rules\[0\] = .*a \(pattern, compression_params\) pair"),
])
def test_bad_settings_name_what_is_wrong(default, rules, match):
    with pytest.raises(ValueError, match=match):
        CompressionPolicy(default, rules)


def test_codec_names_are_case_insensitive_and_a_rule_naming_no_parameter_is_warned_of():
    import torch

    from gradpress.pipeline.table import ParameterTable
    assert CompressionPolicy({"compressor": "TopK", "k": 0.1}).default.codec == "topk"
    assert CompressionPolicy({"compressor": "None"}).default is None  # as "none": uncompressed
    assert CompressionPolicy({"compressor": "PowerSGD"}).default.codec == "powersgd"
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))  # "0.weight", "0.bias"
    policy = CompressionPolicy(ONEBIT, [("*.bias", {"compressor": "none"}), ("module.*", TOPK)])
    with pytest.warns(UserWarning, match="rule 'module.\\*' names none of this optimizer's 2 parameters"):
        ParameterTable(list(model.parameters()), model.named_parameters(), policy)


def test_bad_job_file_tables(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text('[compression]\ndefaults = {}\n')
    with pytest.raises(ValueError, match="unknown key.*defaults"):
        CompressionPolicy.from_job_file(str(f), 0)
    f.write_text('[[compression.rules]]\ncompressor = "onebit"\n')
    with pytest.raises(ValueError, match="needs a string 'pattern'"):
        CompressionPolicy.from_job_file(str(f), 0)
