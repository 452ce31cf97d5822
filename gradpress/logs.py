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
# ... with its line breaks and other control characters escaped: a peer's text cannot start
# a line of its own that reads as this node's (a forged ERROR, say)
_ESCAPED = {c: repr(chr(c))[1:-1] for c in (*range(32), *range(127, 160), 0x2028, 0x2029)}


# numba's CUDA driver logs every failed driver call at ERROR before raising it, an event
# query's "not ready" included (numba catches that one and answers False). It keeps its
# logger at CRITICAL unless NUMBA_CUDA_LOG_LEVEL says otherwise, but only where logging has
# no handler when the driver starts: after configure(), every poll of a copy still running
# (kernels/cuda/uploads.py, worker/host_copies.py) would print an ERROR line. numba's default
# is restored here, and NUMBA_CUDA_LOG_LEVEL's level set where given (numba sets none then).
NUMBA_DRIVER_LOGGER = "numba.cuda.cudadrv.driver"


def configure(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asked = os.environ.get("NUMBA_CUDA_LOG_LEVEL", "").upper()
    level = getattr(logging, asked, None) if asked else None  # (numba's: a name it does not know is CRITICAL)
    logging.getLogger(NUMBA_DRIVER_LOGGER).setLevel(level if isinstance(level, int) else logging.CRITICAL)


def peer(value: object, limit: int = PEER_TEXT_CHARS) -> str:
    """``value`` (bytes, str or anything else a peer supplied) as a log line may quote it:
    at most ``limit`` characters (bytes as their ``repr``, control characters escaped), a
    longer one cut, with its full length said."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        size = len(value) if not isinstance(value, memoryview) else value.nbytes
        text = repr(bytes(value[:limit]))  # never copies more than is shown
        unit = "bytes"
    else:
        text = str(value)
        size, unit = len(text), "chars"
        if not text.isprintable():
            text = text.translate(_ESCAPED)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...({size} {unit})"


class Throttled:
    """A log line that comes once a key (a server's error for each of a job's keys, say),
    written at most once every ``every_s`` seconds for each ``kind`` (its source, say): the
    lines between are counted, and the next one written says how many were not."""

    def __init__(self, logger: logging.Logger, level: int, every_s: float, clock=time.monotonic):
        self.logger, self.level, self.every_s, self.clock = logger, level, every_s, clock
        self._kinds: dict[object, tuple[float, int]] = {}  # kind -> (next line written at, lines held back)

    def __call__(self, kind: object, fmt: str, *args) -> None:
        now = self.clock()
        after, held = self._kinds.get(kind, (float("-inf"), 0))
        if now < after:
            self._kinds[kind] = (after, held + 1)
            return
        self._kinds[kind] = (now + self.every_s, 0)
        self.logger.log(self.level, fmt + (f" (and {held} more not shown before it)" if held else ""), *args)
