"""Checks on received payloads: every header field and buffer is validated against the
element count before a kernel touches it, so a malformed push raises ValueError instead of
writing out of bounds or summing garbage."""
from typing import Any, Sequence

import numpy as np

FLOAT_DTYPES = {"float16": np.float16, "float32": np.float32, "float64": np.float64}


def header_int(header: dict, name: str, low: int, high: int) -> int:
    """``header[name]`` as an int in ``[low, high]``."""
    value = header.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"payload header field {name!r} must be an int in [{low}, {high}], "
                         f"got {value!r}")
    return value


def header_choice(header: dict, name: str, accepted: Sequence[Any]) -> Any:
    """``header[name]``, which must be one of ``accepted``."""
    value = header.get(name)
    if value not in accepted or isinstance(value, bool) != isinstance(accepted[0], bool):
        raise ValueError(f"payload header field {name!r} must be one of {list(accepted)}, "
                         f"got {value!r}")
    return value


def buffer_array(buffers: Sequence[Any], position: int, dtype: type, count: int,
                 what: str) -> np.ndarray:
    """Buffer ``position`` read as ``count`` items of ``dtype`` (zero-copy)."""
    if position >= len(buffers):
        raise ValueError(f"payload has {len(buffers)} buffers, {what} (buffer {position}) "
                         f"is missing")
    raw = memoryview(buffers[position]).cast("B")
    expected = count * np.dtype(dtype).itemsize
    if raw.nbytes != expected:
        raise ValueError(f"payload {what} has {raw.nbytes} bytes, expected {expected}")
    return np.frombuffer(raw, dtype=dtype, count=count)


def expect_buffer_count(buffers: Sequence[Any], count: int) -> None:
    if len(buffers) != count:
        raise ValueError(f"payload has {len(buffers)} buffers, expected {count}")


def finite_scale(value: float, what: str) -> None:
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"payload {what} must be finite and >= 0, got {value}")
