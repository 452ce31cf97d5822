"""The dtype facts torch-facing modules share: a dtype's name, what its values travel as, and
whether it is an integer type (averaged by a floor division)."""
from __future__ import annotations

import torch

# What a floating-point tensor's values travel as. bfloat16 has no numpy dtype: its values
# widen to float32, exactly, and narrow back once the sum lands.
WIRE = {torch.float16: torch.float16, torch.float32: torch.float32, torch.float64: torch.float64,
        torch.bfloat16: torch.float32}


# half-precision dtypes a codec takes widened to float32 (``compressors.spec.WIDENED_DTYPES``)
HALVES = (torch.float16, torch.bfloat16)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``: the name messages, specs and the wire use."""
    return str(dtype).removeprefix("torch.")


def wire_dtype(dtype: torch.dtype) -> torch.dtype | None:
    """The dtype ``dtype``'s values travel as, or None for one that has no floating wire form."""
    return WIRE.get(dtype)


def integral(dtype: torch.dtype) -> bool:
    """An integer dtype: its average is the sum floor-divided, as BytePS's ``floor_divide_``.
    bool counts as one (True is 1): its sum is True where any worker's is, its average where
    every worker's is (a sum of 1 in 2 divided as a float was 0.5, True: an OR)."""
    return not (dtype.is_floating_point or dtype.is_complex)
