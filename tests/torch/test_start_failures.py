"""What ``push_pull`` leaves behind where it fails: a staged tensor's pinned buffer is not
left marked busy by a call the worker refused at once (its name's next call would get a
fresh pinned buffer every time), and a GPU gradient sent as its rows makes the consumer's
stream wait for the work gradpress queued for it. In-process, the worker a stand-in."""
import functools
from types import SimpleNamespace

import pytest
import torch

from gradpress.errors import TensorMismatchError
from gradpress.torch import handles, ops, staging
from gradpress.worker.future import Future


class Staging(staging.HostStaging):
    """Stages into host memory (this host has no GPU to pin for), as a CUDA tensor's is."""

    def stage(self, name, tensor, wire):
        buffer = self._buffers[name] = torch.empty(tensor.numel(), dtype=wire)
        self._busy.add(name)
        return buffer, None


def test_a_staged_call_refused_at_once_leaves_its_buffer_free(monkeypatch):
    def refuse(name, *_, **__):
        raise TensorMismatchError(f"tensor {name!r}: declared as 6 float32 elements by worker 1")
    monkeypatch.setattr(ops, "_client", SimpleNamespace(fatal=None, size=2, push_pull_async=refuse))
    monkeypatch.setattr(ops, "_staging", Staging())
    strided = torch.arange(12, dtype=torch.float32).reshape(3, 4)[:, :2]  # non-contiguous: staged
    with pytest.raises(TensorMismatchError, match="worker 1"):
        ops.push_pull_async_inplace(strided, name="w")
    assert "w" not in ops._staging._busy and "w" not in ops._staging._buffers


@pytest.mark.parametrize("on_gpu", [True, False])
def test_rows_found_on_a_gpu_are_abandoned_by_waiting_for_gradpress_streams(monkeypatch, on_gpu):
    found = Future("rows")
    monkeypatch.setattr(ops, "_settings", SimpleNamespace(sparse_seed=0))
    monkeypatch.setattr(ops.sparse, "start", lambda *a: (found, lambda: "landed"))
    tensor = SimpleNamespace(is_cuda=on_gpu)  # (stands in for a CUDA gradient)
    handle = ops._start_rows(SimpleNamespace(), tensor, None, "e", 1, 0, None)
    pending = handles.lookup(handle)
    if on_gpu:
        assert isinstance(pending.abandon, functools.partial)
        assert pending.abandon.func is staging.after_failure and pending.abandon.args == (tensor,)
    else:
        assert pending.abandon is None
    found.set("rows")
    assert handles.wait(handle, 1) == "landed"  # (and the handle is given back)
