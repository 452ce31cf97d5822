"""gradpress.torch before ``init()``: the error BytePS's callers catch (a ValueError), which
is also gradpress's JobError, naming the call to make."""
import pytest
import torch

import gradpress.torch as bps
from gradpress.errors import JobError
from gradpress.torch import ops


@pytest.mark.parametrize("call", [bps.rank, bps.size, lambda: bps.push_pull(torch.ones(1), name="x")])
def test_calls_before_init_raise_a_value_error_naming_init(monkeypatch, call):
    monkeypatch.setattr(ops, "_client", None)
    with pytest.raises(ValueError, match=r"call gradpress.torch.init\(\) first") as caught:
        call()
    assert isinstance(caught.value, JobError)
