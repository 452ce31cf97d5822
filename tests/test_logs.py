"""logs.configure: numba's CUDA driver keeps its quiet default once gradpress configures logging;
logs.Throttled: a line that comes once a key, written once a while with a count of the rest;
logs.peer: a peer's text quoted on one line."""
import logging

import pytest

from gradpress import logs


@pytest.fixture
def driver_logger():
    logger = logging.getLogger("numba.cuda.cudadrv.driver")  # numba-cuda 0.30's driver logger
    level = logger.level
    logger.setLevel(logging.NOTSET)  # as numba leaves it where logging has a handler at its start
    yield logger
    logger.setLevel(level)


@pytest.mark.parametrize("numba_level, shown", [(None, False), ("ERROR", True), ("debug", True), ("LOUD", False)])
def test_a_not_ready_event_query_logs_nothing_unless_numba_is_asked_to(driver_logger, monkeypatch, caplog,
                                                                       numba_level, shown):
    # numba's driver logs each failed call (an event query's "not ready" too) at ERROR, and
    # sets its logger to CRITICAL only where logging had no handler when the driver started:
    # after configure(), every poll of a GPU copy still running printed an ERROR line
    if numba_level is None:
        monkeypatch.delenv("NUMBA_CUDA_LOG_LEVEL", raising=False)
    else:
        monkeypatch.setenv("NUMBA_CUDA_LOG_LEVEL", numba_level)
    logs.configure("INFO")
    with caplog.at_level(logging.INFO):
        driver_logger.error("Call to cuEventQuery results in CUDA_ERROR_NOT_READY")
        logging.getLogger("gradpress.test").info("gradpress's own line")
    assert "gradpress's own line" in caplog.text
    assert ("CUDA_ERROR_NOT_READY" in caplog.text) == shown, caplog.text
    if numba_level == "debug":  # its level, not the root's (numba sets none where logging has a handler)
        assert driver_logger.isEnabledFor(logging.DEBUG)


def test_a_throttled_line_is_written_once_a_while_and_counts_those_held_back(caplog):
    now = [0.0]
    line = logs.Throttled(logging.getLogger("gradpress.test"), logging.ERROR, 10.0, clock=lambda: now[0])
    with caplog.at_level(logging.ERROR):
        for key in range(5):  # one a key, all at once
            line("server 0", "server 0: key %d failed", key)
        line("server 1", "server 1: key %d failed", 9)  # another kind: not held back by the first
        now[0] = 10.0
        line("server 0", "server 0: key %d failed", 5)
    assert [r.getMessage() for r in caplog.records] == [
        "server 0: key 0 failed", "server 1: key 9 failed", "server 0: key 5 failed (and 4 more not shown before it)"]


def test_a_peers_text_cannot_start_a_log_line_of_its_own():
    # a server's STALLED or ERROR message carrying "\n... ERROR ..." forged a line of this node's log
    forged = "waits\n2026-11-29 12:00:00 ERROR gradpress.worker: all fine\r\x1b[2K\u2028"
    quoted = logs.peer(forged, 500)
    assert quoted == "waits\\n2026-11-29 12:00:00 ERROR gradpress.worker: all fine\\r\\x1b[2K\\u2028", quoted
    assert logs.peer("it had worker 0's, café\ttab") == "it had worker 0's, café\\ttab"
