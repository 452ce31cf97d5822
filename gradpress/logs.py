"""Logging set-up shared by every role, and how a value a peer sent is quoted in a log line."""
import logging
import sys

# A log line quotes at most this many characters of anything a peer sent (identities,
# operation names, error texts): a peer cannot fill the log with one long name.
PEER_TEXT_CHARS = 64
# ... and of a worker's reason for refusing its push, which the server hands every worker of
# the round: the cause of a failure elsewhere (an encoder's CUDA error, an owner's deadline)
REASON_CHARS = 240


def configure(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


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
