"""``Comm``: what a route asks of the job. Routes are handed one, so a test can hand them a fake.

The default sends through ``gradpress.torch.ops``: in-place push_pulls that return a handle,
and ``wait`` that returns the averaged tensor (a new one for a sparse COO input).
"""
from __future__ import annotations

import torch

from ..compressors.spec import CodecSpec


class Comm:
    """The job's push_pulls, through ``gradpress.torch.ops``."""

    def start(self, tensor: torch.Tensor, name: str, *, priority: int = 0, spec: CodecSpec | None = None,
              lr: float | None = None, average: bool = True) -> int:
        """Start summing ``tensor`` over every worker, in place; returns a handle for ``wait``."""
        from ..torch import ops
        return ops.push_pull_async_inplace(tensor, average=average, name=name, priority=priority,
                                           compression_params=spec, lr=lr)

    def start_rows(self, tensor: torch.Tensor, name: str, *, priority: int = 0) -> int:
        """Start averaging a dense tensor in place, sending only its non-zero rows."""
        from ..torch import ops
        return ops.push_pull_rows_async_inplace(tensor, average=True, name=name, priority=priority)

    def wait(self, handle: int, timeout_s: float | None = None) -> torch.Tensor:
        """The average behind ``handle``, waited for at most ``timeout_s`` (default: the job's
        GRADPRESS_OP_TIMEOUT_S and 5 s, as ``synchronize``)."""
        from ..torch import handles, ops
        return ops.synchronize(handle) if timeout_s is None else handles.wait(handle, timeout_s)

    def size(self) -> int:
        from ..torch import ops
        return ops.size()

    def rank(self) -> int:
        from ..torch import ops
        return ops.rank()

    def span(self, name: str, **args):
        """A trace span (``GRADPRESS_TRACE``)."""
        from ..torch import ops
        return ops.client().tracer.span(name, **args)

    @property
    def client(self):
        """The worker's client: error-feedback states, key release, the address book."""
        from ..torch import ops
        return ops.client()

    @property
    def settings(self):
        from ..torch import ops
        return ops.settings()


OPS = Comm()
