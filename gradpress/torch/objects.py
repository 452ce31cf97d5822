"""Bytes from one root worker to all: the transport under broadcast_object and the
optimizer state's layout.

Bytes travel as float16 integers 0..255 (exact, and the zeros the other workers push
add nothing), after their length. The root sends a one-byte kind first: 0 for a
payload, 1 for an error message, so that a root that cannot send its object (it does
not pickle, it is too large) fails every worker with the same error instead of
leaving the others waiting. Receivers check the length against ``max_bytes`` before
they allocate anything.
"""
from __future__ import annotations

import collections
import pickle
from typing import Any

import numpy as np
import torch

from . import ops

# Largest object broadcast_object / allgather_object move (pickled), unless told otherwise.
MAX_OBJECT_BYTES = 64 << 20
_PAYLOAD, _ERROR = 0, 1
_calls: collections.Counter = collections.Counter()


class ObjectError(ValueError):
    """The root could not send its object; every worker raises it with the root's reason."""


def check_root(root_rank: Any, what: str) -> None:
    """A broadcast's root must be a worker of the job: with any other, every worker would
    push zeros, and the parameters (or the bytes) would all come back zero."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)) \
            or not 0 <= root_rank < ops.size():
        raise ValueError(f"{what}: root_rank={root_rank!r} is not a worker's rank (0 to {ops.size() - 1})")


def padded(n: int, bits: int = 3) -> int:
    """``n`` rounded up to ``bits`` significant bits (three: at most 25% more, four sizes an
    octave; four: 12.5%, eight): a name's gathers and broadcasts of sizes that vary take few
    sizes, and so few keys, reused call after call."""
    shift = max(n.bit_length() - bits, 0)
    return -(-n >> shift) << shift


def bytes_to_float16(data: bytes, length: int | None = None) -> torch.Tensor:
    """``data`` as float16 values 0..255, zeros after it up to ``length``."""
    values = torch.zeros(len(data) if length is None else length, dtype=torch.float16)
    values[:len(data)] = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).astype(np.float16))
    return values


def unpickled(data: bytes, sender: str) -> Any:
    """``pickle.loads(data)``; ObjectError naming the sender where it does not unpickle here
    (a class only the sender can import, say)."""
    try:
        return pickle.loads(data)
    except Exception as e:  # noqa: BLE001 - unpickling raises many types; all end the same way
        raise ObjectError(f"the object from {sender} does not unpickle on rank {ops.rank()}: "
                          f"{type(e).__name__}: {e}") from e


def float16_to_bytes(values: torch.Tensor) -> bytes:
    return values.to(torch.uint8).numpy().tobytes()


def broadcast_bytes(payload: bytes | None, error: str | None, root_rank: int, name: str,
                    max_bytes: int = MAX_OBJECT_BYTES, made: list[str] | None = None) -> bytes:
    """The root's ``payload`` on every worker (the root passes it, or ``error``; others None).
    ``made``, when given, gets the names of the tensors the broadcast pushed, names of this
    call's own, for the caller to release; else the name's keys are reused by its next calls.

    Raises:
        ObjectError: the root sent an error, or the length is over ``max_bytes``.
    """
    check_root(root_rank, f"broadcast of {name!r}")
    is_root = ops.rank() == root_rank
    base = f"Object.{name}"
    if made is not None:
        key = (ops.job_epoch(), name)
        base = f"{base}.{_calls[key]}"
        _calls[key] += 1
        made.append(base + ".length")
    frame = b""
    if is_root:
        if error is None and len(payload) > max_bytes:
            error = f"the object is {len(payload)} bytes serialised, over max_bytes={max_bytes}"
        frame = bytes([_ERROR]) + error.encode()[:4096] if error is not None else bytes([_PAYLOAD]) + payload
    length = torch.tensor([float(len(frame))], dtype=torch.float64)
    ops.push_pull_inplace(length, average=False, name=base + ".length")
    n = int(length.item())
    if not 1 <= n <= max_bytes + 1:
        raise ObjectError(f"broadcast of {name!r} from rank {root_rank}: {n} bytes announced, "
                          f"outside 1..max_bytes+1={max_bytes + 1}")
    data = bytes_to_float16(frame, padded(n)) if is_root else torch.zeros(padded(n), dtype=torch.float16)
    if made is not None:
        made.append(f"{base}.data.{padded(n)}")
    ops.push_pull_inplace(data, average=False, name=f"{base}.data.{padded(n)}")
    received = float16_to_bytes(data[:n])
    if received[0] == _ERROR:
        raise ObjectError(f"broadcast of {name!r}: the root (rank {root_rank}) could not send it: "
                          f"{received[1:].decode(errors='replace')}")
    return received[1:]
