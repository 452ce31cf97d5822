"""The byteps.torch API: change ``import byteps.torch as bps`` to ``import gradpress.torch as bps``."""
from .broadcast import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .compression import Compression
from .ops import (declare, init, local_rank, local_size, poll, push_pull, push_pull_async,
                  push_pull_async_inplace, push_pull_inplace, rank, shutdown, size, synchronize)
from .onebit_adam import OneBitAdam
from .optimizer import DistributedOptimizer
from .zero_one_adam import ZeroOneAdam

__all__ = ["init", "shutdown", "rank", "size", "local_rank", "local_size", "declare",
           "push_pull", "push_pull_async", "push_pull_inplace", "push_pull_async_inplace",
           "poll", "synchronize", "DistributedOptimizer", "OneBitAdam", "ZeroOneAdam", "Compression",
           "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object"]
