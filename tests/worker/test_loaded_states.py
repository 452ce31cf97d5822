"""A checkpoint's codec state loaded where the tensor is compressed otherwise (saved with
momentum, loaded without; saved compressed, loaded uncompressed) fails the tensor's
declaration with an error naming it and what to do, rather than a KeyError that killed the
communication thread and the job, or a refusal from the server at the first push_pull."""
import numpy as np
import pytest

from gradpress.compressors.spec import CodecSpec
from gradpress.worker.keys import KeyTable, Tensor

ONEBIT = CodecSpec.from_params({"compressor": "onebit", "ef": "vanilla"})
WITH_MOMENTUM = CodecSpec.from_params({"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov"})


def _declared(table: KeyTable, spec) -> None:
    table.add(Tensor("t", 4, "float32", 1, [4], [0], spec), 1)


def test_a_compressor_state_of_another_chain_is_refused_naming_the_tensor():
    saved = KeyTable()
    _declared(saved, WITH_MOMENTUM)
    state = saved.tensors["t"].compressor.state_dict()
    table = KeyTable()
    table.load_compressor_state("t", state)
    with pytest.raises(ValueError, match="tensor 't': the checkpoint's compressor state does not fit its codec here"):
        _declared(table, ONEBIT)


@pytest.mark.parametrize("spec,now", [(None, "it travels uncompressed"),
                                      (CodecSpec.from_params({"compressor": "onebit"}), "has no error feedback")])
def test_servers_residuals_for_a_tensor_without_server_error_feedback_are_refused(spec, now):
    table = KeyTable()
    table.load_server_state("t", {0: (np.zeros(4, np.float32), None)})
    with pytest.raises(ValueError, match=f"servers' error-feedback residuals, but .*{now}.*other compression settings"):
        _declared(table, spec)
    table = KeyTable()
    table.load_server_state("t", {0: (None, None)})  # no residual was held: nothing to refuse
    _declared(table, spec)
