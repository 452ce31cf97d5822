"""Reading BytePS ``compression_params`` values: each getter checks one key and raises a
ValueError that says what is accepted. Values may be given as strings (as BytePS's
environment-style configuration does)."""
import math
from typing import Sequence

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def choice(params: dict, name: str, accepted: Sequence[str], default: str | None) -> str | None:
    """A string from ``accepted`` (case-insensitive); ``default`` when absent."""
    value = params.get(name, default)
    if value is None:
        return None
    if not isinstance(value, str) or value.lower() not in accepted:
        raise ValueError(f"compression_params[{name!r}] = {value!r}; accepted: "
                         f"{', '.join(accepted)}")
    return value.lower()


def flag(params: dict, name: str, default: bool) -> bool:
    """A boolean; also accepts 0/1 and the strings true/false/yes/no/on/off."""
    value = params.get(name, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    raise ValueError(f"compression_params[{name!r}] = {value!r}; accepted: true or false")


def number(params: dict, name: str, default: float, low: float, high: float,
           integer: bool = False) -> float:
    """A number in ``[low, high]`` (an integer when ``integer``); strings are parsed."""
    value = params.get(name, default)
    try:
        parsed = float(value) if isinstance(value, (str, int, float)) and \
            not isinstance(value, bool) else math.nan
    except (ValueError, OverflowError):  # (an int past a float's range: 10**400)
        parsed = math.nan
    if not low <= parsed <= high or (integer and parsed != int(parsed)):
        kind = "an integer" if integer else "a number"
        raise ValueError(f"compression_params[{name!r}] = {value!r}; accepted: {kind} in "
                         f"[{low:g}, {high:g}]")
    return int(parsed) if integer else parsed


def fraction_or_count(params: dict, name: str, default: float) -> float:
    """BytePS's ``k``: below 1 a fraction of the elements, otherwise a whole count."""
    k = number(params, name, default, 0.0, float(2 ** 32))
    if k <= 0 or (k >= 1 and k != int(k)):
        raise ValueError(f"compression_params[{name!r}] = {params.get(name)!r}; accepted: a "
                         f"fraction in (0, 1) or a whole count >= 1")
    return k


def keep_count(k: float, n: int) -> int:
    """Elements kept out of ``n`` for a ``fraction_or_count`` value: 1..n (0 when n = 0)."""
    if n == 0:
        return 0
    return min(n, max(1, math.ceil(k * n)) if k < 1 else int(k))
