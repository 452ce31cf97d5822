"""The worker side: the push/pull client, partitioning and scheduling."""
from .client import WorkerClient

__all__ = ["WorkerClient"]
