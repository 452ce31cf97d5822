"""The byteps.torch API: change ``import byteps.torch as bps`` to ``import gradpress.torch as bps``."""
from .allgather import allgather, allgather_object
from .broadcast import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .compression import Compression
from .elastic import resume, suspend
from .ops import (declare, init, local_rank, local_size, poll, push_pull, push_pull_async,
                  push_pull_async_inplace, push_pull_inplace, rank, shutdown, size, synchronize)
from .ops import push_pull_async_inplace as byteps_push_pull

__all__ = ["init", "shutdown", "suspend", "resume", "rank", "size", "local_rank", "local_size", "declare",
           "push_pull", "push_pull_async", "push_pull_inplace", "push_pull_async_inplace", "byteps_push_pull",
           "poll", "synchronize", "allgather", "allgather_object", "DistributedOptimizer", "OneBitAdam", "ZeroOneAdam",
           "Compression", "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object"]


def __getattr__(name: str):
    # The optimizers stand on the gradient pipeline, which itself imports this package's
    # tensor helpers (compression, dtypes, sparse): they load on first use, not here.
    if name == "DistributedOptimizer":
        from .optimizer import DistributedOptimizer
        return DistributedOptimizer
    if name in ("OneBitAdam", "ZeroOneAdam"):
        from .. import optim
        return getattr(optim, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
