"""Waking the worker's communication thread from a backward hook (``waker.Waker``):
one byte per idle spell, never blocking, and the GIL kept through the write, so that the
woken thread does not take it and its work while the hook waits inside the write."""
import os
import sys
import threading
import time


from gradpress.worker.waker import Waker


def test_one_byte_until_the_thread_takes_its_commands():
    waker = Waker()
    for _ in range(5):
        waker.wake()
    assert os.read(waker.fd, 100) == b"x"
    waker.due = False  # as the thread does once it has read the pipe
    waker.wake()
    assert os.read(waker.fd, 100) == b"x"


def test_a_full_pipe_never_blocks_the_caller():
    waker = Waker()

    def fill() -> None:
        for _ in range(200_000):  # far past a pipe's 64 KiB
            waker.due = False
            waker.wake()

    filler = threading.Thread(target=fill, daemon=True)
    filler.start()
    filler.join(60)
    assert not filler.is_alive(), "wake() blocked on a full pipe"
    assert len(os.read(waker.fd, 1 << 20)) >= 4096  # it was full


def test_no_other_thread_runs_during_the_write():
    waker = Waker()
    count, stop = [0], threading.Event()

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.05)  # forced switches rare: the spinner runs when the GIL is let go
    spinner = threading.Thread(target=spin, daemon=True)
    try:
        spinner.start()
        while count[0] == 0:  # it runs (we let the GIL go here)
            time.sleep(0.001)
        ran = 0
        for _ in range(200):  # a few microseconds in all, unless a write lets the GIL go
            waker.due = False
            before = count[0]
            waker.wake()
            ran += count[0] != before
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        spinner.join(10)
    assert ran == 0, f"another thread ran during {ran} of 200 wakes"
