"""What a scheduler or server queued last reaches its peers although the process exits at
once after (gradpress/net/transport.py's deliver_queued)."""
import subprocess
import sys
import time

import pytest
import zmq

from gradpress.net import transport

pytestmark = pytest.mark.integ  # starts a process

MESSAGES, SIZE = 500, 100_000   # 50 MB: more than the kernel's socket buffers hold
LINGER_MS = 10_000  # the sender's: time enough for the reader on a loaded machine
# A sender that queues everything, ends its context with deliver_queued or not at all, and
# exits without Python's clean-up (as fast as a process can).
SENDER = """
import os, sys, zmq
from gradpress.net import transport
ctx = zmq.Context()
sock = ctx.socket(zmq.PUSH)
sock.setsockopt(zmq.LINGER, {linger})
sock.setsockopt(zmq.SNDHWM, 0)
sock.connect(sys.argv[1])
for i in range({messages}):
    sock.send(i.to_bytes(4, "little") * ({size} // 4))
sock.close()
if sys.argv[2] == "deliver":
    print("ENDED", transport.deliver_queued(ctx, wait_s={linger} / 1000), flush=True)
os._exit(0)
""".format(messages=MESSAGES, size=SIZE, linger=LINGER_MS)


def received(mode: str) -> tuple[int, str]:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 1)  # its I/O thread stops reading while the test does not
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    sender = subprocess.Popen([sys.executable, "-c", SENDER, f"tcp://127.0.0.1:{port}", mode],
                              stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)  # read nothing while the sender queues: most of the 50 MB waits in its pipe
    count = 0
    while pull.poll(2000):
        pull.recv()
        count += 1
    out, _ = sender.communicate(timeout=30)
    pull.close(linger=0)
    ctx.term()
    return count, out


def test_deliver_queued_hands_everything_over_before_the_process_exits():
    count, out = received("deliver")
    assert "ENDED True" in out, out
    assert count == MESSAGES, f"{count} of {MESSAGES} messages arrived"


def test_without_it_a_process_that_exits_drops_what_it_queued():
    count, _ = received("exit")
    assert count < MESSAGES  # the case above is not passing by chance


def test_a_socket_left_open_does_not_hold_the_end_past_its_deadline():
    ctx = zmq.Context()
    left_open = ctx.socket(zmq.PUSH)
    started = time.monotonic()
    assert transport.deliver_queued(ctx, wait_s=0.5) is False
    assert time.monotonic() - started < 2.0
    left_open.close()  # the context's end, still waiting in its thread, completes
