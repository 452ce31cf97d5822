"""The GPU path checked when a worker joins: where a GPU is visible (or numba's CUDA
simulator is on), numba.cuda must compile and run one of gradpress's encoders. A broken mix
of packages (numba-cuda 0.30 with numpy 2.5, which removed ``numpy.row_stack``) otherwise
kills training at its first compressed push; here ``init()`` stops first, naming the
versions and the fix. The codecs' other CUDA kernels are compiled when a tensor of each
is first handed over (``warmup.ready_on_gpu``), on the thread that hands it."""
from __future__ import annotations

import importlib.metadata

import numpy as np

FIX_ROW_STACK = ("numba-cuda before 0.31 calls numpy.row_stack, which numpy 2.5 removed: install "
                 "numpy<2.5 (pip install 'numpy<2.5') or a numba-cuda that supports this numpy")
FIX_OTHER = ("install a numba-cuda that supports this CUDA driver and numpy, or keep this worker's "
             "tensors on the CPU (CUDA_VISIBLE_DEVICES=)")


class CudaPathBroken(RuntimeError):
    pass


def gpu_path_in_use() -> bool:
    import torch
    from numba import config
    return bool(config.ENABLE_CUDASIM) or torch.cuda.is_available()


def check(local_rank: int = 0) -> None:
    """Compile and run the onebit encoder on a tiny device array, on the GPU this worker
    will likely use (``device_for_check``).

    Raises:
        CudaPathBroken: naming numba, numba-cuda, numpy and torch's versions, what failed,
            and the fix.
    """
    if not gpu_path_in_use():
        return
    try:
        from numba import cuda

        from ..compressors.registry import build_compressor
        from ..kernels.cuda.streams import on_device, stream
        codec = build_compressor({"compressor": "onebit", "scaling": True}, "worker")
        with on_device(device_for_check(local_rank)):
            # copied on the stream the encoder runs on: gradpress's does not wait for the legacy default stream's
            x = cuda.to_device(np.linspace(-1.0, 1.0, 64, dtype=np.float32), stream=stream())
            codec.compress(x, key=0, round=0)
    except Exception as e:  # whatever numba raises: the message must name it
        raise CudaPathBroken(describe(e)) from e


def device_for_check(local_rank: int) -> int:
    """The GPU to run the check on: one the program already works on, else the one
    BytePS's examples choose right after ``init()``, the local rank's. A check on GPU 0
    would give every worker of the machine a CUDA context there, hundreds of MB each, and
    fail outright where GPUs are in exclusive-process mode.

    The program works on torch's current GPU where it has a CUDA context there
    (``torch.cuda.set_device`` makes one under CUDA 12; a GPU where it made none counts as
    unchosen, and the local rank's is taken); a model moved with ``.to("cuda:2")``
    alone leaves the current GPU at 0 with no context, and the context on GPU 2."""
    import torch
    count = torch.cuda.device_count()
    if torch.cuda.is_initialized():
        current = torch.cuda.current_device()
        has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)  # asks, never makes one
        if has_context is None:
            return current
        in_use = [d for d in [current, *range(count)] if has_context(d)]
        if in_use:
            return in_use[0]
    return local_rank % count if count else 0


def describe(error: BaseException) -> str:
    import numba
    import torch
    fix = FIX_ROW_STACK if "row_stack" in str(error) else FIX_OTHER
    return (f"this worker's GPU path cannot run: numba.cuda failed to compile or run a kernel "
            f"({type(error).__name__}: {error}); numba {numba.__version__}, numba-cuda {_version('numba-cuda')}, "
            f"numpy {np.__version__}, torch {torch.__version__}. Fix: {fix}")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
