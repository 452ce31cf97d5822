"""Device-array plumbing: views of torch tensors / CUDA arrays, launches, copies."""
import contextlib
import logging
import os
import threading
import warnings
from typing import Any

import numpy as np
from numba import config, cuda

from .streams import event, finished, on_device, produced, recycle, stream, torch_stream, wait_for, working_on  # noqa: F401

log = logging.getLogger(__name__)

THREADS = 128  # threads per block


def quiet_small_grid_warnings() -> None:
    """numba warns at every launch of fewer than 128 blocks ("Grid size N will likely result
    in GPU under-utilization"). gradpress sizes each grid to its data on purpose (a small
    partition takes a block or a few), so those warnings were most of a GPU worker's log
    (24 to 58 lines a job on the H200), and building each one cost a launch 1.4 us of Python.
    Turned off here, unless ``NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS`` says otherwise."""
    if "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS" in os.environ or config.ENABLE_CUDASIM:
        return
    try:  # numba-cuda's dispatcher may read a config of its own
        from numba.cuda import dispatcher
    except ImportError:
        return
    for settings in (config, getattr(dispatcher, "config", config)):
        settings.CUDA_LOW_OCCUPANCY_WARNINGS = 0


quiet_small_grid_warnings()


def blocks(threads: int) -> int:
    return max(1, (threads + THREADS - 1) // THREADS)


LINE_WORDS = 16  # 8-byte words in a 128-byte cache line


def line_padded(words: int) -> int:
    """``words`` 8-byte words rounded up to whole 128-byte cache lines. Why: an SM's L1
    cache is not coherent with the other SMs' within a launch (PTX's default ``ld.ca``), so
    where a segment's last block reads what the segment's other blocks wrote in the same
    launch, no line it reads may also hold another segment's words: its SM could have
    cached that line before they were written, and a later last block there would read the
    stale copy. Each segment's words start on a line of their own."""
    return -(-words // LINE_WORDS) * LINE_WORDS


device_line_padded = cuda.jit(device=True, inline=True)(line_padded)


def as_device(x: Any) -> Any:
    """A numba device array viewing ``x`` (zero-copy)."""
    if config.ENABLE_CUDASIM:  # the simulator has no as_cuda_array; its arrays pass as is
        return x
    return cuda.as_cuda_array(x)


def on_device_of(x: Any):
    """A context in which numba launches on ``x``'s GPU (a torch CUDA tensor's device; the
    current one for anything else, and under the simulator)."""
    device = getattr(x, "device", None)
    if config.ENABLE_CUDASIM or getattr(device, "type", None) != "cuda" or device.index is None:
        return contextlib.nullcontext()
    return on_device(device.index)


def length(x: Any) -> int:
    return int(x.shape[0])


def itemsize(x: Any) -> int:
    size = getattr(x, "element_size", None)  # a torch tensor (bfloat16 has no numpy dtype)
    return int(size()) if callable(size) else np.dtype(x.dtype).itemsize


def float32_view(x: Any) -> Any:
    """``x`` as a float32 device array; torch tensors of other dtypes are converted first."""
    if len(x.shape) != 1:
        raise ValueError(f"compress input must be 1-D, got shape {tuple(x.shape)}")
    if "float32" not in str(x.dtype):
        if not hasattr(x, "float"):
            raise ValueError(f"device input must be float32 (or a torch tensor), got {x.dtype}")
        x = x.float()
    return as_device(x.contiguous() if hasattr(x, "contiguous") else x)


def to_host(x: Any) -> np.ndarray:
    """A host numpy copy of a device array or CUDA tensor."""
    if hasattr(x, "cpu") and hasattr(x, "numpy"):
        x = x.detach()
        return (x.float() if str(x.dtype) == "torch.bfloat16" else x).cpu().numpy()
    with working_on(x):  # on the array's own device (``streams._index_of``), from any thread
        s = stream()
        host = as_device(x).copy_to_host(stream=s)
        s.synchronize()
    return host


def copy_from_host(host: np.ndarray, out: Any) -> None:
    """``out[:] = host`` for a device array or CUDA tensor of any float dtype."""
    if hasattr(out, "copy_"):
        import torch
        out.copy_(torch.from_numpy(host))
        return
    target = as_device(out)
    s = stream()
    target.copy_to_device(host.astype(target.dtype, copy=False), stream=s)
    s.synchronize()  # ``host`` may be a reused pinned scratch: the copy must be over first


def copy_to_host_into(x: Any, host: np.ndarray) -> None:
    """``host[:] = x`` for a CUDA tensor or device array of ``host``'s dtype: one DMA copy
    (at the bus's speed where ``host`` is pinned or registered, see ``pin_host``)."""
    if hasattr(x, "cpu") and hasattr(x, "numpy"):
        import torch
        torch.from_numpy(host).copy_(x.detach())
        return
    s = stream()
    as_device(x).copy_to_host(host, stream=s)
    s.synchronize()


def copy_to_host_queued(x: Any, host: np.ndarray) -> Any:
    """Queue ``host[:] = x`` (a CUDA tensor or device array of ``host``'s dtype) on
    gradpress's stream (``working_on``'s) and return at once, with an event recorded after
    the copy: the host reads ``host`` only once that event is done (``worker/host_copies.py``
    waits for it). Where ``host`` is pinned or registered (``pin_host``) the copy is DMA and
    the call never waits; into pageable memory the driver finishes it before returning."""
    if hasattr(x, "cpu") and hasattr(x, "numpy"):
        import torch
        torch.from_numpy(host).copy_(x.detach(), non_blocking=True)
        # blocking: the thread that waits sleeps rather than spinning a core; reused once
        # waited for (``copied``): a fresh one is a driver event made and destroyed a partition
        done = event(x.device.index, blocking=True)
        done.record(torch.cuda.current_stream(x.device))
        return done
    s = stream()
    as_device(x).copy_to_host(host, stream=s)
    done = cuda.event()
    done.record(s)
    return done


def copied(done: Any, x: Any) -> None:
    """``copy_to_host_queued(x, ...)``'s event ``done`` has been waited for on the host: it may
    be recorded again (torch's are reused; numba's are not)."""
    if hasattr(x, "cpu") and hasattr(x, "numpy"):
        recycle(done, x.device.index, blocking=True)


def land_divided(host: np.ndarray, out: Any, divisor: int, wait: bool = True) -> None:
    """``out[:] = host / divisor`` on the device: the host array goes over at its own size,
    and the divide runs there, in float32 arithmetic for float16 with one rounding (as the
    host's ``divide_half``). A true division, never a multiply by the reciprocal.

    ``wait=False`` returns before the copy is done: right where ``host`` is pageable (the
    driver has staged it before the call returns) or a result slot that nobody rewrites
    before this worker's next push of the key, which its stream orders after this copy."""
    if hasattr(out, "copy_") and hasattr(out, "div_"):
        import torch
        with torch.no_grad():
            out.copy_(_host_tensor(torch, host), non_blocking=not wait)
            if divisor != 1:  # a 0-dim device tensor: torch turns a CPU scalar into 1/divisor
                out.div_(_divisor_tensor(divisor, out.device))
        return
    target = as_device(out)
    s = stream()
    target.copy_to_device(np.ascontiguousarray(host, target.dtype), stream=s)
    if divisor != 1:
        _divide[blocks(target.shape[0]), THREADS, s](target, np.float64(divisor))
    if wait:
        s.synchronize()


_read_only_seen = False  # torch has given its one warning about a read-only array (caught)
_read_only_lock = threading.Lock()


def _host_tensor(torch: Any, host: np.ndarray) -> Any:
    """torch's view of a pulled result. A pulled frame is read-only memory, and torch warns,
    once per process, that it does not support writing to it (this copy only reads it):
    that warning is caught at the first read-only one. Not at every call: catch_warnings
    swaps the process's filters, which is unsafe while other threads warn, cost 1.9 us a
    call, and made Python's once-only warnings (numba's among them) print again each time."""
    global _read_only_seen
    if _read_only_seen or host.flags.writeable:
        return torch.from_numpy(host)
    with _read_only_lock, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        view = torch.from_numpy(host)
        _read_only_seen = True
    return view


_DIVISORS: dict = {}


def _divisor_tensor(divisor: int, dev: Any) -> Any:
    key = (divisor, str(dev))
    if key not in _DIVISORS:
        import torch
        _DIVISORS[key] = torch.tensor(float(divisor), dtype=torch.float32, device=dev)
    return _DIVISORS[key]


@cuda.jit(cache=True)
def _divide(x, d):
    i = cuda.grid(1)
    if i < x.shape[0]:
        x[i] = x[i] / d


class HostRegistration:
    """Host memory registered with the CUDA driver (``pin_host``), on the device whose
    context registered it. ``release`` unregisters it there. Why not leave it to numba: its
    object unregisters from a finalizer on whichever thread collects it, where that context
    may not be current (the call then fails, and the pages stay locked), and possibly after
    the memory was unmapped."""

    def __init__(self, pinned: Any, index: int):
        self._pinned, self.index = pinned, index

    def release(self) -> None:
        """Unregister now (once; the copies that use the memory must have ended)."""
        if self._pinned is not None:
            with on_device(self.index):
                self._pinned = None  # its last reference: numba's finalizer unregisters it here, now


def pin_host(buffer: Any, nbytes: int) -> HostRegistration | None:
    """Register ``nbytes`` of host memory at ``buffer`` (an mmap or array) with the CUDA
    driver of the current device, so copies to and from it are DMA at the bus's speed rather
    than staged through the driver's own bounce buffers. It stays registered until released
    (or collected); None where it cannot be (the simulator, no GPU, a driver refusal): copies
    then still work, staged."""
    if config.ENABLE_CUDASIM:
        return None
    try:
        from numba.cuda.cudadrv import driver
        context = cuda.current_context()
        pinned = context.mempin(buffer, driver.host_pointer(buffer), nbytes, mapped=False)
        return HostRegistration(pinned, context.device.id)
    except Exception as e:  # noqa: BLE001 - any refusal leaves the memory usable, only slower
        if not _refusals:
            log.warning("the CUDA driver refused to register %d bytes of host memory for DMA (%s: %s): "
                        "copies between it and the GPU are staged, slower", nbytes, type(e).__name__, e)
        _refusals.append(nbytes)
        return None


_refusals: list[int] = []  # registrations the driver refused (the first is logged)


_scratch = threading.local()


def host_scratch(n: int, near: Any = None) -> np.ndarray:
    """A pinned float32 host array of ``n`` elements, this thread's own, reused by every call
    of the same length (a host decode's landing before its copy to ``near``)."""
    cache = _scratch.__dict__.setdefault("by_length", {})
    if n not in cache:
        if len(cache) >= 64:  # partitions come in a few sizes; a job of many is not hoarded
            cache.clear()
        cache[n] = pinned_host(n, np.float32, near)
    return cache[n]


def pinned_host(n: int, dtype: Any, near: Any = None) -> np.ndarray:
    """A page-locked host array (numpy's interface) for DMA copies; a plain one under the
    simulator. Made in ``near``'s GPU's context where ``near`` is a CUDA tensor: on a thread
    with no GPU selected, numba would make (and pin it in) a context on GPU 0."""
    if config.ENABLE_CUDASIM:
        return np.empty(n, dtype)
    with on_device_of(near):
        return cuda.pinned_array(n, dtype)


def empty(n: int, dtype: type) -> Any:
    return cuda.device_array(n, dtype)


def from_host(host: np.ndarray) -> Any:
    """A new device array of ``host``'s values, there before anything gradpress's stream
    queues next. (Without a stream, numba's copy goes on the legacy default stream, which
    gradpress's non-blocking streams do not wait for, and from pageable memory it may
    return before the last bytes land.) A host wait: for state restored from a checkpoint."""
    s = stream()
    made = cuda.to_device(np.ascontiguousarray(host), stream=s)
    s.synchronize()
    return made
