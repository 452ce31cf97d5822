"""SIGTERM's ``Terminated``, raised by its handler wherever the main thread is, passes through
the handlers that turn any other exception into a refusal: a malformed message's and a key's
failed work. (It was logged as a malformed message, and the server served on; or as the key's
internal error.)"""
import signal

import numpy as np
import pytest

from gradpress.errors import Terminated
from gradpress.net import protocol
from gradpress.net.protocol import Op
from gradpress.server.engine import Engine
from gradpress.trace import Tracer


def _stopped(*args, **kwargs):
    raise Terminated(signal.SIGTERM)


def test_a_sigterm_while_a_header_is_decoded_is_not_a_malformed_message(monkeypatch):
    frame = protocol.encode(Op.HEARTBEAT, "worker 0")
    monkeypatch.setattr(protocol.msgpack, "unpackb", _stopped)
    with pytest.raises(Terminated):
        protocol.decode(frame)


@pytest.mark.parametrize("where", ["engine", "key"])
def test_a_sigterm_during_a_keys_work_stops_the_server_instead_of_failing_the_key(monkeypatch, where):
    engine = Engine(0, None, "inproc://unused", "inproc://unused", "server 0", num_workers=1,
                    async_mode=False, tracer=Tracer(""))
    init = protocol.decode(protocol.encode(Op.INIT_KEY, "worker 0", key=3, name="t", count=2, dtype="float32"))
    assert engine.serve(b"w0", init, []) == []
    push = protocol.decode(protocol.encode(Op.PUSH, "worker 0", key=3, round=0, dtype="float32", count=2))
    if where == "engine":
        monkeypatch.setattr(engine, "_handle", _stopped)
    else:
        monkeypatch.setattr(type(engine.keys[3]), "push", _stopped)
    with pytest.raises(Terminated):
        engine.serve(b"w0", push, [np.ones(2, np.float32).tobytes()])
