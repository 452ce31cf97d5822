"""``streams.drain``: at a job's end the worker waits on the host, up to a deadline, for all
that gradpress's CUDA streams hold before it unmaps the host memory their copies use. A
stand-in for torch's events (there is no GPU here) says when each stream's work ends."""
import time
import types

from gradpress.kernels.cuda import streams


class _Stream:
    def __init__(self, ends_at: float):
        self.ends_at = ends_at


class _Event:
    def record(self, stream: _Stream) -> None:
        self.stream = stream

    def query(self) -> bool:
        return time.monotonic() >= self.stream.ends_at


def test_drain_waits_for_every_stream_and_gives_up_at_its_deadline(monkeypatch):
    monkeypatch.setattr(streams, "_torch", lambda: types.SimpleNamespace(cuda=types.SimpleNamespace(Event=_Event)))
    soon = time.monotonic() + 0.05
    monkeypatch.setattr(streams, "_pairs", {(0, 0): (None, _Stream(0.0)), (0, 1): (None, _Stream(soon))})
    assert streams.drain(5.0) and time.monotonic() >= soon, "it returned before the landing stream ended"
    never = time.monotonic() + 3600
    monkeypatch.setattr(streams, "_pairs", {(0, 0): (None, _Stream(0.0)), (1, 1): (None, _Stream(never))})
    start = time.monotonic()
    assert not streams.drain(0.05)
    assert time.monotonic() - start < 2, "no deadline"
    monkeypatch.setattr(streams, "_torch", lambda: None)   # no GPU used: nothing to wait for
    assert streams.drain(0.0)
