"""byteps.torch.parallel: ``DistributedDataParallel`` over push_pull."""
from .distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
