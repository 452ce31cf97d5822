"""Tensors that travel as another tensor, and land back in their own.

- A complex tensor travels as its real view (the real and imaginary parts side by side):
  they add apart, as torch.distributed sums complex tensors. Nothing is copied.
- A float16 or bfloat16 tensor with ``compression_params`` travels widened to float32 (on
  its device), the codecs' input type, and its average is narrowed back into it: as
  ``DistributedOptimizer`` sends half-precision gradients. A raw push_pull refused them.
"""
from __future__ import annotations

from typing import Callable

import torch

from .dtypes import HALVES


def carrier(tensor: torch.Tensor, output: torch.Tensor, compressed: bool,
            ) -> tuple[torch.Tensor, torch.Tensor, Callable[[], None] | None] | None:
    """(what travels, what its average lands in, what then lands it in ``output``), or None
    where ``tensor`` travels as itself."""
    if tensor.is_complex():
        return torch.view_as_real(tensor), torch.view_as_real(output), None
    if compressed and tensor.dtype in HALVES:
        wide = tensor.detach().float()

        def narrow() -> None:
            with torch.no_grad():
                output.copy_(wide)
        return wide, wide, narrow
    return None
