"""gradpress's own optimizers whose momentum, not the gradient, travels compressed: 1-bit Adam
and 0/1 Adam, on the gradient pipeline (``gradpress.pipeline``)."""
from .onebit_adam import OneBitAdam
from .zero_one_adam import ZeroOneAdam

__all__ = ["OneBitAdam", "ZeroOneAdam"]
