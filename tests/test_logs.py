"""logs.configure: numba's CUDA driver keeps its quiet default once gradpress configures logging."""
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


@pytest.mark.parametrize("numba_level, shown", [(None, False), ("ERROR", True)])
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
