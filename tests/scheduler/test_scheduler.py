"""The scheduler in-process, its peers played by SchedulerLinks: barriers and their errors."""
import signal
import threading
import time

import pytest

from cluster import TEST_SECRET
from gradpress.config import Settings, agreed
from gradpress.errors import RegistrationRefused, Terminated
from gradpress.net import transport
from gradpress.net.node import SchedulerLink
from gradpress.net.protocol import Op
from gradpress.scheduler.scheduler import Scheduler


class _Job(dict):
    scheduler: Scheduler
    thread: threading.Thread


@pytest.fixture
def job():
    """A running scheduler with one worker and one server registered; yields their links (and
    the scheduler, as ``.scheduler``)."""
    common = dict(num_worker=1, num_server=1, root_uri="127.0.0.1", node_host="127.0.0.1",
                  heartbeat_interval_s=0.1, heartbeat_timeout_s=30, connect_timeout_s=30, job_secret=TEST_SECRET)
    scheduler = Scheduler(Settings(role="scheduler", root_port=0, **common))
    running = threading.Thread(target=scheduler.run, daemon=True)
    running.start()
    at = dict(common, root_port=scheduler.port)
    links = _Job({role: SchedulerLink(Settings(role=role, launch_id=f"{role}-launched", **at), role,
                                      transport.context()) for role in ("worker", "server")})
    links.scheduler, links.thread = scheduler, running
    server_registered = threading.Thread(target=links["server"].register, daemon=True)
    server_registered.start()
    links["worker"].register()
    server_registered.join(timeout=30)
    yield links
    scheduler.exit_code = 0
    running.join(timeout=5)
    for link in links.values():
        link.close()


def _next(link, op, timeout_s=5.0):
    """The next message of kind ``op`` from the scheduler (heartbeats skipped)."""
    while link.sock.poll(timeout_s * 1000):
        _, header, _ = transport.recv(link.sock, routed=False)
        if header is not None and header["op"] == op:
            return header
    raise AssertionError(f"no {op.name} from the scheduler within {timeout_s} s")


def _ops_within(link, within_s):
    """The operations the scheduler sends ``link`` within ``within_s`` seconds."""
    ops, deadline = [], time.monotonic() + within_s
    while (left := deadline - time.monotonic()) > 0 and link.sock.poll(left * 1000):
        _, header, _ = transport.recv(link.sock, routed=False)
        if header is not None:
            ops.append(header["op"])
    return ops


def test_an_unknown_barrier_group_is_an_error_naming_the_barrier(job):
    job["worker"].send(Op.BARRIER, group="workers", seq=3)
    error = _next(job["worker"], Op.ERROR)
    assert (error["group"], error["seq"]) == ("workers", 3), "the worker could not tell which barrier failed"
    assert "unknown barrier group 'workers'" in error["message"]


def test_a_barrier_completes_once_its_whole_group_arrived(job):
    job["worker"].send(Op.BARRIER, group="all", seq=1)
    assert Op.BARRIER_DONE not in _ops_within(job["worker"], 0.3), "done before the server arrived"
    job["server"].send(Op.BARRIER, group="all", seq=1)
    for link in job.values():
        done = _next(link, Op.BARRIER_DONE)
        assert (done["group"], done["seq"]) == ("all", 1)


def test_a_registration_after_a_normal_end_is_refused_saying_why():
    """After a job ended well (no failure to quote), a late worker (BytePS's elastic example
    resuming into the same scheduler) is told the job ended, not refused with an empty reason."""
    from gradpress.errors import RegistrationRefused
    common = dict(num_worker=1, num_server=1, root_uri="127.0.0.1", node_host="127.0.0.1",
                  heartbeat_interval_s=0.1, heartbeat_timeout_s=30, connect_timeout_s=30, job_secret=TEST_SECRET)
    scheduler = Scheduler(Settings(role="scheduler", root_port=0, **common))
    scheduler.exit_code = 0  # the job ended normally, and lingers for a member's acknowledgement
    scheduler._linger_until = time.monotonic() + 10
    running = threading.Thread(target=scheduler.run, daemon=True)
    running.start()
    link = SchedulerLink(Settings(role="worker", root_port=scheduler.port, **common), "worker", transport.context())
    try:
        with pytest.raises(RegistrationRefused, match="the job already ended"):
            link.register()
    finally:
        link.close()
        scheduler._linger_until = 0.0
        running.join(timeout=5)


def test_an_abort_from_a_process_not_in_the_running_job_leaves_it_running(job):
    """A refused process's report (a second job started on this job's port with its secret:
    its workers refused, each reports its failure), or ids no worker can have (the scheduler
    used to compute a rank past 64 bits and die encoding NODE_LOST): it names no member, is
    answered, and the job goes on. (It ended the running job.)"""
    stranger = SchedulerLink(job["worker"].settings, "worker", transport.context())
    try:
        for ids in ({"worker_id": -1, "local_rank": 0}, {"worker_id": 2 ** 63, "local_rank": 2 ** 63}):
            stranger.send(Op.ABORT, reason="in init(): RegistrationRefused: a test's", pid=4242, **ids)
            assert "running without that process" in _next(stranger, Op.SHUTDOWN)["reason"]
        for link in (job["worker"], job["server"]):
            assert Op.NODE_LOST not in _ops_within(link, 0.5)
        job["worker"].send(Op.BARRIER, group="all", seq=1)
        job["server"].send(Op.BARRIER, group="all", seq=1)
        assert _next(job["server"], Op.BARRIER_DONE)["seq"] == 1
    finally:
        stranger.close()


def test_a_launchers_report_names_its_own_process_and_never_another_jobs_worker_by_its_slot(job):
    """A launcher names the process it started by GRADPRESS_LAUNCH_ID (its child may be a shell
    whose pid no member has): another job's launcher reporting its DMLC_WORKER_ID=0, and a pid
    that a member has too (pods number their processes alike), names no worker of this running
    job (it named this job's worker 0, and ended the job); its own launcher's report does."""
    import os
    launcher = SchedulerLink(job["worker"].settings, "worker", transport.context())
    try:
        launcher.send(Op.ABORT, reason="exited with code 1", pid=os.getpid(), worker_id=0, local_rank=0,
                      launch="another")
        assert "running without that process" in _next(launcher, Op.SHUTDOWN)["reason"]
        assert Op.NODE_LOST not in _ops_within(job["server"], 0.5)
        launcher.send(Op.ABORT, reason="exited with code 3", pid=4242, worker_id=0, local_rank=0,
                      launch="worker-launched")
        lost = _next(job["server"], Op.NODE_LOST)
        assert (lost["role"], lost["rank"]) == ("worker", 0) and "code 3" in lost["reason"], lost
    finally:
        launcher.close()


def test_nodes_that_disagree_on_asynchronous_training_are_refused(waiting_scheduler):
    """BYTEPS_ENABLE_ASYNC set on the workers and not the servers (or the other way): servers
    summing deltas zeroed the model, and the reverse trained each worker apart, without a word."""
    with pytest.raises(RegistrationRefused, match=r"BYTEPS_ENABLE_ASYNC=1 differs from the scheduler's 0"):
        waiting_scheduler("server", enable_async=True).register()


def test_a_worker_whose_job_wide_settings_differ_from_the_first_workers_is_refused_naming_one(waiting_scheduler):
    """Settings that decide a job's keys (GRADPRESS_FUSE_BELOW_BYTES, BYTEPS_PARTITION_BYTES, ...)
    set apart on one worker failed only at a deadline, naming a tensor of gradpress's own."""
    import os
    first, second = waiting_scheduler("worker"), waiting_scheduler("worker", fuse_below_bytes=0)
    first.send(Op.REGISTER, role="worker", host="127.0.0.1", port=5002, worker_id=-1, local_rank=0, local_size=1,
               pid=os.getpid(), machine="", agree=agreed(first.settings))
    _kept(waiting_scheduler.scheduler, 1)
    alive, beating = threading.Event(), threading.Thread(target=lambda: _beat(first, alive), daemon=True)
    beating.start()  # (a silent first worker would give its place up to the second)
    try:
        with pytest.raises(RegistrationRefused, match=r"GRADPRESS_FUSE_BELOW_BYTES=0 differs from 65536 of the "
                                                      r"worker registered already .*must set it alike"):
            second.register()
    finally:
        alive.set()
        beating.join(timeout=5)


def _kept(scheduler, members: int) -> None:
    """Wait until ``scheduler`` keeps ``members`` registrations (two links connect apart: the
    later one's REGISTER may arrive first)."""
    deadline = time.monotonic() + 10
    while len(scheduler.roster.members) < members:
        assert time.monotonic() < deadline, "the first REGISTER never arrived"
        time.sleep(0.01)


def _beat(link, stop: threading.Event) -> None:
    while not stop.wait(0.1):
        link.send(Op.HEARTBEAT)


def test_an_abort_naming_ids_out_of_range_before_the_job_starts_ends_it_naming_an_unknown_worker(
        waiting_scheduler):
    """Before the job starts a refused process's report ends the job (the others would wait out
    their connect timeout for it), and ids no worker can have are named an unknown worker."""
    server, stranger = waiting_scheduler("server"), waiting_scheduler("worker")
    _register_silently(server)  # (the job waits for its worker)
    _kept(waiting_scheduler.scheduler, 1)
    stranger.send(Op.ABORT, reason="a test's", pid=4242, worker_id=2 ** 63, local_rank=2 ** 63)
    lost = _next(server, Op.NODE_LOST)
    assert lost["rank"] == -1 and "a test's" in lost["reason"], lost


def test_a_message_that_fails_in_the_scheduler_is_dropped_and_the_job_goes_on(job, monkeypatch):
    """Whatever no check foresaw in one message must not end the job's only scheduler."""
    arrive, failed = job.scheduler.barriers.arrive, threading.Event()

    def failing_once(*args):
        monkeypatch.setattr(job.scheduler.barriers, "arrive", arrive)
        failed.set()
        raise RuntimeError("a test's")
    monkeypatch.setattr(job.scheduler.barriers, "arrive", failing_once)
    job["worker"].send(Op.BARRIER, group="all", seq=1)  # dropped
    assert failed.wait(5), "the scheduler never took the BARRIER"
    job["worker"].send(Op.BARRIER, group="all", seq=1)  # (as a retry would)
    job["server"].send(Op.BARRIER, group="all", seq=1)
    done = _next(job["server"], Op.BARRIER_DONE)
    assert (done["group"], done["seq"]) == ("all", 1), done



@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_sigterm_that_lands_in_a_messages_handling_stops_the_scheduler(job, monkeypatch):
    """Not dropped as that message's failure, the job going on: the signal's stop would be lost."""
    def stopped(*args):
        raise Terminated(signal.SIGTERM)
    monkeypatch.setattr(job.scheduler.barriers, "arrive", stopped)
    job["worker"].send(Op.BARRIER, group="all", seq=1)
    job.thread.join(timeout=5)
    assert not job.thread.is_alive(), "the scheduler served on"


@pytest.fixture
def waiting_scheduler():
    """A scheduler of one worker and one server, none registered yet (PS_HEARTBEAT_TIMEOUT
    0.5 s), and a maker of links to it."""
    common = dict(num_worker=1, num_server=1, root_uri="127.0.0.1", node_host="127.0.0.1",
                  heartbeat_interval_s=0.1, heartbeat_timeout_s=0.5, connect_timeout_s=30, job_secret=TEST_SECRET)
    scheduler = Scheduler(Settings(role="scheduler", root_port=0, **common))
    running = threading.Thread(target=scheduler.run, daemon=True)
    running.start()
    links = []

    def link(role, **settings):
        links.append(SchedulerLink(Settings(role=role, **dict(common, root_port=scheduler.port, **settings)), role,
                                   transport.context()))
        return links[-1]
    link.scheduler = scheduler
    yield link
    scheduler.exit_code = 0
    running.join(timeout=5)
    for made in links:
        made.close()


def _register_silently(link, **fields):
    """A REGISTER and never a heartbeat after it: a node that died once registered."""
    import os
    link.send(Op.REGISTER, role="server", host="127.0.0.1", port=5001, worker_id=-1, local_rank=0, local_size=1,
              pid=os.getpid(), machine="", **fields)


def test_a_node_silent_before_the_job_starts_gives_its_place_to_the_one_that_replaces_it(waiting_scheduler):
    """A server pod that registered, died and restarted before the workers came: its first
    self held the place for good, the restarted one was refused (all servers registered), and
    the job waited out GRADPRESS_CONNECT_TIMEOUT_S. A node waiting for the start heartbeats:
    one silent for PS_HEARTBEAT_TIMEOUT gives its place up, and is told so."""
    dead, restarted, worker = waiting_scheduler("server"), waiting_scheduler("server"), waiting_scheduler("worker")
    _register_silently(dead)
    time.sleep(0.8)
    books = []
    joined = threading.Thread(target=lambda: books.append(restarted.register()), daemon=True)
    joined.start()
    time.sleep(0.3)  # (its REGISTER first: the worker's would complete the job with the dead one)
    worker.register()
    joined.join(timeout=10)
    assert books and books[0] is not None, "the restarted server did not join the job"
    told = _next(dead, Op.ERROR)
    assert "registration was given up: silent for more than PS_HEARTBEAT_TIMEOUT" in told["message"], told


def test_a_live_node_keeps_its_place_before_the_job_starts(waiting_scheduler):
    from gradpress.errors import RegistrationRefused
    alive, extra, worker = waiting_scheduler("server"), waiting_scheduler("server"), waiting_scheduler("worker")
    waiting = threading.Thread(target=alive.register, daemon=True)  # heartbeats while it waits
    waiting.start()
    time.sleep(0.8)
    with pytest.raises(RegistrationRefused, match="DMLC_NUM_SERVER=1: all 1 server processes registered already"):
        extra.register()
    worker.register()  # the job starts with the live one
    waiting.join(timeout=10)
    assert alive.book is not None
