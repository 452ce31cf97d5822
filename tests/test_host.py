"""gradpress/host.py: which processes share CPUs, how many there are, and a worker's
training CPU apart from its communication thread's."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

from gradpress import host

CHILD = "from gradpress import host; print(host.machine_id()); print(host.cores())"


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.mark.integ  # starts processes
def test_processes_on_this_machine_share_its_id_and_see_its_cores():
    mine = host.machine_id()
    assert mine and mine.split(":", 1)[0] == open("/proc/sys/kernel/random/boot_id").read().strip()
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == [mine, str(host.cores())]
    assert host.cores() == len(os.sched_getaffinity(0))


@pytest.mark.integ  # starts processes
def test_cores_follow_the_affinity():
    pin = "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
    pinned = subprocess.run([sys.executable, "-c", pin + CHILD], capture_output=True, text=True, timeout=60,
                            check=True)
    assert pinned.stdout.split()[1] == "1.0"


def test_training_cpu_leaves_the_communication_thread_out():
    go, done, leave = threading.Event(), threading.Event(), threading.Event()

    def comm():  # alive until the test has read the meter (a thread's clock ends with it)
        go.wait(30)
        _burn(0.3)
        done.set()
        leave.wait(30)
    t = threading.Thread(target=comm, daemon=True)
    t.start()
    meter = host.TrainingCpu(t)
    before = meter.read()[0]
    go.set()
    assert done.wait(30)
    assert meter.read()[0] - before < 0.1, "the communication thread's CPU counted as training"
    before = meter.read()[0]
    _burn(0.3)
    assert 0.28 < meter.read()[0] - before < 0.4
    leave.set()
    t.join(30)


def test_zeromq_threads_cpu_is_the_sockets_not_training():
    ctx = zmq.Context(io_threads=1)
    out, into = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    port = into.bind_to_random_port("tcp://127.0.0.1")
    out.connect(f"tcp://127.0.0.1:{port}")
    try:
        meter = host.TrainingCpu(threading.current_thread())  # (this thread's own CPU left out too)
        block = np.ones(8 << 20, np.uint8)
        training0, sockets0 = meter.read()
        for _ in range(40):  # 320 MB through loopback TCP: the kernel's copies on ZeroMQ's I/O thread
            out.send(block, copy=False)
            into.recv(copy=False)
        training, sockets = meter.read()
        assert sockets - sockets0 >= 0.03, "ZeroMQ's I/O thread spent no CPU on 320 MB"
        assert training - training0 < sockets - sockets0, "the sockets' CPU counted as training"
    finally:
        out.close(linger=0)
        into.close(linger=0)
        ctx.term()


def test_without_per_thread_cpu_clocks_no_meter_is_made(monkeypatch):
    assert host.TrainingCpu.available()
    monkeypatch.delattr(time, "pthread_getcpuclockid")
    assert not host.TrainingCpu.available()
    with pytest.raises(OSError, match="per-thread CPU clocks"):
        host.TrainingCpu(threading.current_thread())


def test_every_thread_cpu_is_read_from_its_own_clock_not_in_ticks():
    burnt, stop = [], threading.Event()

    def spin():
        _burn(0.05)
        burnt.append(time.thread_time())  # then it waits, using no CPU
        stop.wait(30)
    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        for _ in range(300):
            if burnt:
                break
            time.sleep(0.01)
        cpus = {tid: cpu for (_, tid), cpu in host.thread_cpu_s().items()}
        # /proc's ticks are 10 ms: a reading that close comes from the thread's own clock
        assert abs(cpus[spinner.native_id] - burnt[0]) < 0.002, (cpus[spinner.native_id], burnt)
    finally:
        stop.set()
        spinner.join(30)
