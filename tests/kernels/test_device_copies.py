"""The worker's device-side copies (kernels/cuda/device.py) through their torch branch, on
CPU tensors standing in for CUDA ones (the same calls): a result lands divided as the host
path divides it (a true division; float16 in float32 with one rounding), from read-only
frame memory too, and a partition copies out whole."""
import numpy as np
import pytest
import torch

from gradpress.kernels.cpu import fp16
from gradpress.kernels.cuda import device


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("divisor", [1, 3, 7])
def test_a_result_lands_divided_as_the_host_divides_it(dtype, divisor):
    summed = (np.random.default_rng(divisor).standard_normal(10_001) * 50).astype(dtype)
    frame = np.frombuffer(summed.tobytes(), dtype=dtype)   # read-only, as a pulled frame is
    want = np.empty_like(summed)
    if dtype == "float16":
        fp16.divide_half(summed, divisor, want)
    else:
        np.divide(summed, divisor, out=want)
    out = torch.empty(summed.shape[0], dtype=getattr(torch, dtype))
    device.land_divided(frame, out, divisor)
    assert out.numpy().tobytes() == want.tobytes()


def test_a_partition_copies_into_host_memory_whole():
    x = torch.arange(1000, dtype=torch.float32)
    host = np.zeros(300, np.float32)
    device.copy_to_host_into(x[200:500], host)
    assert np.array_equal(host, np.arange(200, 500, dtype=np.float32))


def test_state_restored_to_the_device_is_copied_on_gradpress_stream_and_there_before_it_returns(monkeypatch):
    # a residual or momentum loaded from a checkpoint: the encoder that reads it next runs on
    # gradpress's non-blocking stream, which would not wait for the legacy default stream
    calls = []

    class Stream:
        def synchronize(self):
            calls.append("synchronize")
    made = Stream()
    monkeypatch.setattr(device, "stream", lambda: made)

    def to_device(host, stream=0):
        calls.append(("to_device", stream, host.tolist()))
        return "device array"
    monkeypatch.setattr(device.cuda, "to_device", to_device)
    assert device.from_host(np.arange(4, dtype=np.float32)[::2]) == "device array"
    assert calls == [("to_device", made, [0.0, 2.0]), "synchronize"]
