"""byteps.torch's core calls: init, ranks, and push_pull with handles.

A push_pull sums a tensor over every worker (and divides by the number of
workers with ``average=True``). CPU tensors of float16/32/64 travel straight from
and into their own memory, CUDA ones by the GPU's copies or kernels; others
(non-contiguous, bfloat16, integers) go through a CPU staging copy that is written
back when the caller synchronizes, on the caller's thread. Some travel as another
tensor (``carriers``): a complex one as its real view, CUDA int64 as float64 halves.
"""
from __future__ import annotations

import functools
import itertools
import threading

import torch

from .. import allocator, exit_gc, gil, logs
from ..compressors.spec import CodecSpec
from ..config import Settings
from ..errors import JobError, NotInitializedError, RegistrationRefused
from ..worker import WorkerClient
from . import carriers, cuda_check, exact_ints, failures, handles, modes, sparse, staging
from .compression import Compression
from .dtypes import dtype_name, integral, wire_dtype

_client: WorkerClient | None = None
_settings: Settings | None = None
_lock = threading.Lock()
_noname = itertools.count()
_epoch = 0  # how many jobs this process joined (resume() joins another): per-job counters key on it
_atexit_registered = False
_staging = staging.HostStaging(lambda name: _client is not None and _client.tensor(name) is not None)  # pinned, by name
DEVICE_RAW = (torch.float32, torch.float16, torch.float64)  # CUDA dtypes that travel uncompressed from the device


def init(lazy: bool = True) -> None:
    """Join the job: register with the scheduler and connect to every server.

    Settings come from the environment (``DMLC_*``, ``BYTEPS_*``, ``GRADPRESS_*``) and
    the job file named by ``GRADPRESS_CONFIG``. ``lazy`` is accepted for BytePS
    compatibility; gradpress always connects at once.

    Raises:
        ValueError: a setting is wrong, or asks for a BytePS mode gradpress does not
            implement (named). The scheduler hears of it, so the other workers stop too.
        CudaPathBroken: a GPU is visible but numba.cuda cannot compile or run a kernel
            here (``cuda_check``: the versions and the fix named); reported likewise.
    """
    global _client, _settings, _epoch, _noname, _atexit_registered
    with _lock:
        if _client is not None:
            return
        settings = Settings.load()
        if settings.role != "worker":
            raise ValueError(f"gradpress.torch.init() runs in workers; DMLC_ROLE is {settings.role!r}")
        logs.configure(settings.log_level)
        allocator.configure(settings)
        gil.configure(settings)
        try:
            modes.check(settings)
            cuda_check.check(settings.local_rank)  # before registering: a broken GPU path stops the job now
            client = WorkerClient(settings)
            client.start()
        except RegistrationRefused as e:  # the others would wait GRADPRESS_CONNECT_TIMEOUT_S for this worker
            failures.report_init_failure(settings, e, registered=False)
            raise
        except JobError as e:  # the scheduler ended the job, or cannot be reached: nothing to report to
            raise failures.rejoining(e, _epoch) or e
        except Exception as e:
            failures.report_init_failure(settings, e)
            raise
        _client, _settings = client, settings
        _epoch += 1
        _noname = itertools.count()
        failures.install(lambda: _client)
        if not _atexit_registered:
            exit_gc.configure(settings, failures.leave_at_exit(shutdown, lambda: _client))
            _atexit_registered = True


def job_epoch() -> int:
    """How many jobs this process has joined: 1 after init(), 2 after a resume(), ..."""
    return _epoch


def shutdown() -> None:
    """Leave the job: tell the scheduler this worker is done and wait for the others."""
    global _client
    with _lock:
        client, _client = _client, None
    if client is not None:  # (after a fatal error, only its communication thread's end is waited for)
        client.finish()


def _require() -> WorkerClient:
    if _client is None:
        raise NotInitializedError("gradpress is not initialised: call gradpress.torch.init() first")
    if _client.fatal is not None:
        raise _client.fatal
    return _client


def client() -> WorkerClient:
    """This worker's client: for optimizers that checkpoint compressor and server state."""
    return _require()


def rank() -> int:
    return _require().rank


def size() -> int:
    return _require().size


def local_rank() -> int:
    """As BytePS: still answers after suspend() (this process's place on its machine does not change)."""
    return _last_settings().local_rank


def local_size() -> int:
    return _last_settings().local_size


def _last_settings() -> Settings:
    if _client is not None or _settings is None:
        _require()
    return _settings


def settings() -> Settings:
    _require()
    return _settings


def declare(name: str, **_ignored) -> int:
    """Announce a tensor name, as byteps.torch does. Keys do not depend on declaration order
    here (the scheduler assigns them at a tensor's first push_pull): nothing to do. Returns 0."""
    return 0


def push_pull_async(tensor: torch.Tensor, average: bool = True, name: str | None = None,
                    version: int = 0, priority: int = 0, *, compression_params: dict | None = None,
                    lr: float | None = None) -> int:
    """Start summing ``tensor`` over all workers into a new tensor; returns a handle.

    ``compression_params`` (BytePS's keys: compressor, ef, momentum, k, ...) compress the
    tensor both ways, per partition, with error feedback on workers and servers; ``lr``
    is the current learning rate, which corrected error feedback needs.
    """
    return _start(tensor, torch.empty_like(tensor), average, name, priority, compression_params, lr)


def push_pull_async_inplace(tensor: torch.Tensor, average: bool = True, name: str | None = None,
                            version: int = 0, priority: int = 0, *, compression_params: dict | None = None,
                            lr: float | None = None) -> int:
    """Start summing ``tensor`` over all workers in place; returns a handle."""
    return _start(tensor, tensor, average, name, priority, compression_params, lr)


class _PushPull(torch.autograd.Function):
    """push_pull as an autograd function, as in BytePS: the gradient of a push_pull is the
    push_pull (same name, same ``average``) of the gradients every worker's output got."""

    @staticmethod
    def forward(ctx, tensor, average, name, version, priority, compression_params, lr):
        ctx.args = (average, name, version, priority, compression_params)
        return synchronize(push_pull_async(tensor, average, name, version, priority,
                                           compression_params=compression_params, lr=lr))

    @staticmethod
    def backward(ctx, grad_output):
        average, name, version, priority, compression_params = ctx.args
        summed = push_pull(grad_output, average, name, version, priority, compression_params=compression_params)
        return summed, None, None, None, None, None, None


def push_pull(tensor: torch.Tensor, average: bool = True, name: str | None = None, version: int = 0,
              priority: int = 0, compression=Compression.none, *, compression_params: dict | None = None,
              lr: float | None = None) -> torch.Tensor:
    """Sum (or average) ``tensor`` over all workers; returns a new tensor.

    Differentiable: when ``tensor`` requires grad, the backward pass push_pulls the
    gradient under the same name (every worker must then run backward through it).
    """
    compressed, ctx = compression.compress(tensor)
    if name is None:  # the backward pass reuses the forward's name: fix it now
        name = f"{staging.NONAME}{next(_noname)}"
    out = _PushPull.apply(compressed, average, name, version, priority, compression_params, lr)
    return compression.decompress(out, ctx)


def push_pull_inplace(tensor: torch.Tensor, average: bool = True, name: str | None = None,
                      version: int = 0, priority: int = 0, *, compression_params: dict | None = None,
                      lr: float | None = None) -> torch.Tensor:
    return synchronize(push_pull_async_inplace(tensor, average, name, version, priority,
                                               compression_params=compression_params, lr=lr))


def poll(handle: int) -> bool:
    """True once the push_pull behind ``handle`` has finished (or failed)."""
    return handles.lookup(handle).future.done()


def synchronize(handle: int) -> torch.Tensor:
    """Wait for the push_pull behind ``handle`` and return its output tensor."""
    return handles.wait(handle, _settings.op_timeout_s + 5)


def _start(tensor: torch.Tensor, output: torch.Tensor, average: bool, name: str | None,
           priority: int, compression_params: dict | CodecSpec | None = None, lr: float | None = None) -> int:
    client = _require()
    handles.before_start()
    name = name if name is not None else f"{staging.NONAME}{next(_noname)}"
    spec = None
    if compression_params is not None:
        spec = CodecSpec.from_params(compression_params, f"push_pull of {name!r}: compression_params")
    # complex, half precision to compress, 64-bit integers on a GPU
    carried = carriers.carrier(tensor, output, spec is not None, client.size if average else 1)
    if carried is not None:
        handle = _start(carried.travels, carried.lands_in, average and not carried.summed, name, priority, spec, lr)
        handles.lookup(handle).then(output, carried.land)
        return handle
    if spec is not None and spec.is_lowrank:
        raise ValueError(f"push_pull of {name!r}: compressor {spec.codec!r} factors a model's gradient matrices "
                         f"across steps; use it through DistributedOptimizer (compression_params)")
    if spec is not None:
        spec.check_dtype(dtype_name(tensor.dtype), f"push_pull of {name!r}")
    divisor = client.size if average else 1
    if sparse.travels_as_rows(tensor, name):  # its rows travel, hashed over the servers; the result is a new tensor
        if spec is not None:
            raise ValueError(f"push_pull of {name!r}: compression_params on a sparse tensor; its rows travel "
                             f"exactly (or as float16 with Compression.fp16)")
        return _start_rows(client, tensor, sparse.rows_of_coo(tensor, name), name, divisor, priority, None)
    contiguous = tensor.is_contiguous() and output.is_contiguous()
    # on the GPU: compressed by the CUDA kernels, or (float16/32/64, uncompressed) moved by
    # DMA straight between the tensor and the shared push segment or result, divided there
    on_gpu = (tensor.is_cuda and output.is_cuda and contiguous and output.dtype == tensor.dtype
              and (spec is not None or tensor.dtype in DEVICE_RAW))
    direct = (tensor.device.type == "cpu" and output.device.type == "cpu" and wire_dtype(tensor.dtype) == tensor.dtype
              and contiguous)
    finish = abandon = None  # what a finished one leaves to do, and a failed one to undo (handles.Pending)
    if on_gpu:  # CUDA kernels compress, or the DMA copies read, straight from device memory
        src = tensor.detach().reshape(-1)
        out = src if output is tensor else output.detach().reshape(-1)
        future = client.push_pull_async(name, src, out, divisor, priority, spec, lr,
                                        ready=staging.produced(tensor))

        def finish(src=src) -> None:  # holds src too: the worker's stream may read it until this wait
            staging.before_consumer(output, future.device_event)
        abandon = functools.partial(staging.after_failure, output, src)  # failed: all the worker queued so far
    elif direct:  # numpy's reshape of a contiguous array is a view, without torch's dispatch
        src = tensor.detach().numpy().reshape(-1)
        out = src if output is tensor else output.detach().numpy().reshape(-1)
        future = client.push_pull_async(name, src, out, divisor, priority, spec, lr)
    else:
        wire = wire_dtype(tensor.dtype) or torch.float64  # integers: exactly (int64 in halves: exact_ints.py)
        buffer, copied = _staging.stage(name, tensor, wire)
        arr = buffer.numpy()
        # an integer average is the sum floor-divided, as BytePS's floor_divide_ gives it
        # (dividing in float64 and copying back would round toward zero: -3/2 -> -1, not -2)
        floor_by = divisor if integral(output.dtype) else 1
        try:
            future = client.push_pull_async(name, arr, arr, divisor // floor_by, priority, spec, lr, ready=copied)
        except BaseException:  # refused at once (a mismatch, the job over): the buffer is not left busy
            _staging.failed(name, buffer)
            raise

        def copy_back(buffer=buffer, output=output, floor_by=floor_by) -> None:
            try:
                with torch.no_grad():
                    summed = _staging.summed(buffer, output)
                    if floor_by > 1:
                        summed = exact_ints.floor_divided(summed, floor_by)
                    output.copy_(summed, non_blocking=output.is_cuda and buffer.is_pinned())
            finally:
                _staging.done(name, buffer, output.device)
        finish = copy_back
        abandon = functools.partial(_staging.failed, name, buffer)
    return handles.register(handles.Pending(future, output, finish, abandon))


def push_pull_rows_async_inplace(tensor: torch.Tensor, average: bool = True, name: str | None = None,
                                 priority: int = 0) -> int:
    """Start summing a dense tensor of 2+ dimensions in place, sending only its non-zero
    rows (hashed over the servers); rows no worker touched come back zero."""
    client = _require()
    name = name if name is not None else f"{staging.NONAME}{next(_noname)}"
    rows = sparse.dense_rows(tensor, name)  # on a GPU: found later, off this thread
    return _start_rows(client, tensor, rows, name, client.size if average else 1, priority, tensor)


def _start_rows(client: WorkerClient, tensor: torch.Tensor, rows, name: str, divisor: int, priority: int,
                dense_out: torch.Tensor | None) -> int:
    future, result = sparse.start(client, tensor, rows, name, divisor, priority, _settings.sparse_seed, dense_out)
    abandon = functools.partial(staging.after_failure, tensor) if tensor.is_cuda else None  # (as _start's)
    pending = handles.Pending(future, tensor, None, abandon)
    pending.finish = lambda: setattr(pending, "output", result())
    return handles.register(pending)
