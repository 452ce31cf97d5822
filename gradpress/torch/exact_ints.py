"""64-bit integers summed exactly by servers that add floating-point values.

Integer tensors travel as float64, which holds every integer only below 2**53: an int64
sum of larger values came back rounded, silently. A 64-bit integer x travels instead as
two float64 values, its high 32 bits (x >> 32, signed) and its low 32 bits (x & 0xFFFFFFFF,
0 to 2**32 - 1). Either half summed over up to 2**20 workers stays below 2**52 in
magnitude, so float64 adds it exactly. Put back together as hi * 2**32 + lo in int64
arithmetic, the result is the exact sum, wrapping modulo 2**64 where it overflows, as
torch's own int64 addition (and torch.distributed's all_reduce) wraps. uint64 shares
int64's bits and its sum modulo 2**64.

Narrower integers need none of this: an int32 sum over 2**20 workers stays below 2**51.
"""
from __future__ import annotations

import torch

SPLIT = (torch.int64, torch.uint64)  # the dtypes that travel as two halves
_LOW = 0xFFFFFFFF


def split(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` (int64 or uint64, any shape) as a flat float64 tensor of twice its elements
    on its device: every high half, then every low half. (A GPU's are made there and travel
    like any float64 tensor: no host copy that waits for the device.)"""
    x = tensor.detach().reshape(-1).view(torch.int64)  # uint64: the same bits
    halves = torch.empty(2 * x.numel(), dtype=torch.float64, device=x.device)
    halves[:x.numel()] = x >> 32
    halves[x.numel():] = x & _LOW
    return halves


def join(halves: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The flat ``dtype`` values whose halves, summed over workers, ``halves`` holds."""
    n = halves.numel() // 2
    high, low = halves[:n].to(torch.int64), halves[n:].to(torch.int64)
    return torch.bitwise_left_shift(high, 32).add_(low).view(dtype)


def floor_divided(total: torch.Tensor, divisor: int) -> torch.Tensor:
    """``total // divisor`` for an integer tensor, uint64 too (torch has no unsigned 64-bit
    division): the quotient of half the value, doubled, then corrected by the remainder,
    which stays below ``2 * divisor`` (Hacker's Delight, 9-3)."""
    if total.dtype != torch.uint64:
        return torch.floor_divide(total, divisor)
    x = total.view(torch.int64)
    q = torch.bitwise_left_shift(torch.bitwise_right_shift(x, 1).bitwise_and_(2**63 - 1) // divisor, 1)
    q += (x - q * divisor) >= divisor
    return q.view(torch.uint64)
