"""Logging set-up shared by every role, and how a value a peer sent is quoted in a log line."""
import logging
import os
import sys
import time

# A log line quotes at most this many characters of anything a peer sent (identities,
# operation names, error texts): a peer cannot fill the log with one long name.
PEER_TEXT_CHARS = 64
# ... and of a worker's reason for refusing its push, which the server hands every worker of
# the round: the cause of a failure elsewhere (an encoder's CUDA error, an owner's deadline)
REASON_CHARS = 240


# numba's CUDA driver logs every failed driver call at ERROR before raising it, an event
# query's "not ready" included (numba catches that one and answers False). It keeps its
# logger at CRITICAL unless NUMBA_CUDA_LOG_LEVEL says otherwise, but only where logging has
# no handler when the driver starts: after configure(), every poll of a copy still running
# (kernels/cuda/uploads.py, worker/host_copies.py) would print an ERROR line. numba's default
# is restored here; NUMBA_CUDA_LOG_LEVEL still chooses.
NUMBA_DRIVER_LOGGER = "numba.cuda.cudadrv.driver"


def configure(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not os.environ.get("NUMBA_CUDA_LOG_LEVEL"):
        logging.getLogger(NUMBA_DRIVER_LOGGER).setLevel(logging.CRITICAL)


def peer(value: object, limit: int = PEER_TEXT_CHARS) -> str:
    """``value`` (bytes, str or anything else a peer supplied) as a log line may quote it:
    at most ``limit`` characters (bytes as their ``repr``, escapes kept), a longer one cut,
    with its full length said."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        size = len(value) if not isinstance(value, memoryview) else value.nbytes
        text = repr(bytes(value[:limit]))  # never copies more than is shown
        unit = "bytes"
    else:
        text = str(value)
        size, unit = len(text), "chars"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...({size} {unit})"


class Throttled:
    """A log line that comes once a key (a server's error for each of a job's keys, say),
    written at most once every ``every_s`` seconds: the lines between are counted, and the
    next one written says how many there were."""

    def __init__(self, logger: logging.Logger, level: int, every_s: float, clock=time.monotonic):
        self.logger, self.level, self.every_s, self.clock = logger, level, every_s, clock
        self._next = float("-inf")
        self._held = 0

    def __call__(self, fmt: str, *args) -> None:
        now = self.clock()
        if now < self._next:
            self._held += 1
            return
        held, self._held, self._next = self._held, 0, now + self.every_s
        self.logger.log(self.level, fmt + ("" if not held else f" (and {held} more like it before)"), *args)

