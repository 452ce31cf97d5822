"""Device counterparts of ``array_ops.HostOps`` for the stateful wrappers, on gradpress's
stream (``device.stream()``)."""
from typing import Any

import numpy as np
from numba import cuda

from gradpress.kernels.cpu.norms import INF_BITS
from gradpress.kernels.cuda import device, norms, scratch
from gradpress.kernels.cuda.compensation import compensated
from gradpress.kernels.cuda.device import THREADS, blocks


@cuda.jit(cache=True)
def _add_scaled(out, a, alpha, b):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = compensated(a[i], alpha, b[i])


@cuda.jit(cache=True)
def _subtract(out, a, b):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = a[i] - b[i]


class DeviceOps:
    """Wrapper state on the GPU is float32 (torch tensors of other dtypes are converted)."""

    working = staticmethod(device.float32_view)

    @staticmethod
    def empty_like(x: Any) -> Any:
        return device.empty(x.shape[0], np.float32)

    @staticmethod
    def landed(x: Any) -> None:
        """What a decompress queued into ``x`` on the landing stream comes before what the
        push stream queues next (a wait on the device, not the host)."""
        device.wait_for(device.finished(x), x)

    @staticmethod
    def add_scaled(out: Any, a: Any, alpha: float, b: Any) -> None:
        _add_scaled[blocks(out.shape[0]), THREADS, device.stream()](out, a, np.float64(alpha), b)

    @staticmethod
    def subtract(out: Any, a: Any, b: Any) -> None:
        _subtract[blocks(out.shape[0]), THREADS, device.stream()](out, a, b)

    @staticmethod
    def all_finite(x: Any) -> bool:
        return norms.max_abs_bits(x) < INF_BITS

    @staticmethod
    def adopt(state: Any, like: Any) -> Any:
        """State loaded from a checkpoint (host arrays) moved to the device."""
        if isinstance(state, np.ndarray):
            return device.from_host(state.astype(np.float32))
        return state


@cuda.jit(cache=True)
def _compensate_checked(g, e, lam, e_out, flag, epoch):
    """e_out = p = g + lam * e (``_add_scaled``'s arithmetic); flag[0] = epoch on a NaN/inf
    (see ``scratch.epoch``)."""
    i = cuda.grid(1)
    if i < e_out.shape[0]:
        p = compensated(g[i], lam, e[i])
        e_out[i] = p
        if not abs(p) < np.inf:
            flag[0] = epoch


_FLAG = scratch.Layout(((np.int32, 1),), 1)


def compensate_flagged(g: Any, e: Any, lam: float, e_out: Any, flag: Any, epoch: int = 1) -> None:
    """e_out = g + lam * e on gradpress's stream; ``flag[0]`` (a device int) becomes
    ``epoch`` on a NaN/inf, for a later kernel or copy to read: the host does not wait for it."""
    _compensate_checked[blocks(e_out.shape[0]), THREADS, device.stream()](
        g, e, np.float64(lam), e_out, flag, np.int32(epoch))


def compensate_checked(g: Any, e: Any, lam: float, e_out: Any) -> bool:
    """e_out = g + lam * e in one pass; whether all of it is finite (one host read)."""
    whole, (flag,) = scratch.staged(_FLAG)
    epoch = scratch.epoch()
    _compensate_checked[blocks(e_out.shape[0]), THREADS, device.stream()](
        g, e, np.float64(lam), e_out, flag, epoch)
    (flag_host,) = scratch.copy_back(whole, _FLAG, scratch.pinned("flag", _FLAG.nbytes, np.uint8))
    return bool(flag_host[0] != epoch)
