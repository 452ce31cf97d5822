"""Tensors that travel as another tensor, and land back in their own.

- A complex tensor travels as its real view (the real and imaginary parts side by side):
  they add apart, as torch.distributed sums complex tensors. Nothing is copied.
- A float16 or bfloat16 tensor with ``compression_params`` travels widened to float32 (on
  its device), the codecs' input type, and its average is narrowed back into it: as
  ``DistributedOptimizer`` sends half-precision gradients. A raw push_pull refused them.
- A GPU's int64 or uint64 tensor travels as its two float64 halves (``exact_ints``), made on
  its device and summed like any float64 GPU tensor; the sum is joined there, floor-divided
  for an average. (Staged through the host, each call waited for the device twice: a
  BatchNorm's ``num_batches_tracked`` at every forward of ``DistributedDataParallel``.)
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from . import exact_ints
from .dtypes import HALVES


class Carried(NamedTuple):
    travels: torch.Tensor                 # what is push_pulled
    lands_in: torch.Tensor                # where its result lands
    land: Callable[[], None] | None       # then puts it in the caller's output
    summed: bool = False                  # travels summed; ``land`` averages


def carrier(tensor: torch.Tensor, output: torch.Tensor, compressed: bool, divisor: int) -> Carried | None:
    """How ``tensor`` travels for an ``output`` averaged over ``divisor`` workers, or None
    where it travels as itself. A sparse tensor travels as its rows (``sparse.py``), whose
    own dtype check names what they cannot carry: a carrier of it would be a sparse tensor
    of another shape, its result never landed in ``output``."""
    if tensor.layout != torch.strided:
        return None
    if tensor.is_complex():
        return Carried(torch.view_as_real(tensor), torch.view_as_real(output), None)
    if compressed and tensor.dtype in HALVES:
        wide = tensor.detach().float()

        def narrow() -> None:
            with torch.no_grad():
                output.copy_(wide)
        return Carried(wide, wide, narrow)
    if not compressed and tensor.device.type != "cpu" and tensor.dtype in exact_ints.SPLIT:
        halves = exact_ints.split(tensor)

        def join() -> None:
            with torch.no_grad():
                total = exact_ints.join(halves, output.dtype)
                output.copy_((exact_ints.floor_divided(total, divisor) if divisor > 1 else total).view(output.shape))
        return Carried(halves, halves, join, summed=True)
    return None
