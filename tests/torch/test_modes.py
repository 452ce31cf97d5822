"""BytePS modes gradpress does not implement are refused at init(), naming the setting;
a failure is reported by its first error line."""
import pytest

from gradpress.config import Settings
from gradpress.torch import modes
from gradpress.worker.abort import MAX_REASON_CHARS, first_error_line


@pytest.mark.parametrize("var", sorted(modes.UNSUPPORTED))
def test_an_unsupported_mode_is_refused_naming_its_variable(var):
    with pytest.raises(ValueError, match=var):
        modes.check(Settings(), {var: "1"})


def test_unset_or_zero_is_fine():
    assert modes.check(Settings(), {"DMLC_ENABLE_RDMA": "0", "BYTEPS_ENABLE_MIXED_MODE": ""}) is None
    with pytest.raises(ValueError, match="DMLC_ENABLE_RDMA"):  # the same variable, set, is refused
        modes.check(Settings(), {"DMLC_ENABLE_RDMA": "1"})


def test_async_mode_refuses_a_job_file_that_compresses(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('[compression.default]\ncompressor = "onebit"\n')
    with pytest.raises(ValueError, match="BYTEPS_ENABLE_ASYNC"):
        modes.check(Settings(enable_async=True, config_file=str(job)), {})
    modes.check(Settings(enable_async=False, config_file=str(job)), {})


def test_first_error_line_is_the_type_and_the_first_line_of_the_message():
    assert first_error_line(ValueError("boom at step 3\nmore detail")) == "ValueError: boom at step 3"
    assert first_error_line(KeyError("k")) == "KeyError: 'k'"
    assert len(first_error_line(RuntimeError("x" * 10000))) == MAX_REASON_CHARS
