"""``WorkerClient``: a worker's push/pull calls, safe to make from any thread.

Each call becomes a typed command (``commands.py``) for the communication thread
(``comm.py``), which owns every socket; the call then waits on a ``Future`` with a
deadline, or returns it (``push_pull_async``).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..compressors.spec import CodecSpec
from ..compressors.arrays import is_device_array
from ..compressors.warmup import ready_on_gpu, warm_up
from ..config import Settings
from ..errors import JobError, OpTimeoutError
from ..net import auth, transport
from ..net.node import AddressBook
from ..placement import partition_counts
from ..row_placement import RowLayout
from ..trace import Tracer
from . import commands as cmd
from .comm import CommunicationThread
from .future import Future
from .jobs import PushPull
from .keys import Tensor, by_key, check_server_states
from .row_finder import RowFinder
from .sparse import SparseResult, SparseRows, SparseShares
from .stages import DRAIN_S

# numpy builds ``dtype.name`` afresh on every access (11% of the backward hooks' time, in
# py-spy): the names of the dtypes a push_pull carries, looked up instead
_DTYPE_NAMES = {np.dtype(t): np.dtype(t).name for t in (np.float16, np.float32, np.float64, np.int32, np.int64)}


def _dtype_name(src) -> str:
    """``src``'s element type as the wire names it (a numpy array or a torch tensor)."""
    if isinstance(src, np.ndarray):
        return _DTYPE_NAMES.get(src.dtype) or src.dtype.name
    return str(src.dtype).replace("torch.", "")


class WorkerClient:
    def __init__(self, settings: Settings):
        auth.job_keys(settings)  # no usable job secret: bps.init() raises JobSecretError, saying what to set
        self.s = settings
        self.tracer = Tracer(settings.trace)
        self.comm = CommunicationThread(settings, transport.own_context(settings), self.tracer)
        self.aborted = False  # abort() was called: finish() must not wait for the others
        self.raised: JobError | None = None  # the first a push_pull raised to the program (its exit status)
        self.row_finder = RowFinder()  # finds GPU gradients' rows (push_pull_sparse_later)

    @property
    def fatal(self) -> JobError | None:
        return self.comm.fatal

    @property
    def book(self) -> AddressBook | None:
        return self.comm.book

    # ---- calls from any thread ------------------------------------------

    def start(self) -> AddressBook:
        warm_up("worker")  # before registering: compiling later would silence the heartbeats
        self.comm.start()
        self.comm.ready.wait(self.s.connect_timeout_s + 5)
        if self.fatal:
            raise self.fatal
        if self.book is None:
            raise OpTimeoutError("worker: the communication thread did not start")
        return self.book

    @property
    def rank(self) -> int:
        return self.book.rank

    @property
    def size(self) -> int:
        return self.book.num_workers

    @property
    def bytes_pushed(self) -> int:
        return self.comm.stages.bytes_pushed if self.comm.stages else 0

    @property
    def bytes_pulled(self) -> int:
        return self.comm.stages.bytes_pulled if self.comm.stages else 0

    def declare(self, name: str, count: int, dtype: str, spec: CodecSpec | None = None,
                layout: RowLayout | None = None) -> Tensor:
        """Declare a tensor (once per name; waits for every worker to declare it alike);
        with ``layout``, a row-sparse one."""
        t, declaring = self._declaration(name, count, dtype, spec, layout)
        if t is not None:
            return t
        self.comm.submit(declaring)
        return declaring.future.result(self.s.op_timeout_s + 5)

    def _declaration(self, name: str, count: int, dtype: str, spec: CodecSpec | None, layout: RowLayout | None,
                     start: Callable[[Tensor | None, int], cmd.StartPushPull] | None = None,
                     ) -> tuple[Tensor | None, cmd.Declare | None]:
        """(the tensor, None) where ``name`` is declared alike already, else (None, the
        command that declares it), carrying ``start(None, partitions)`` where given."""
        if not isinstance(name, str):  # caught here: on the wire it would end the communication thread
            raise TypeError(f"a tensor's name must be a str, got {type(name).__name__} {name!r}")
        t = self.comm.table.tensors.get(name)
        if t is not None:
            t.check_alike(count, dtype, spec, layout)
            return t, None
        if spec is not None:
            spec.check_dtype(dtype, f"tensor {name!r}")
        parts = layout.declared_parts() if layout is not None else \
            partition_counts(count, np.dtype(dtype).itemsize, self.s.partition_bytes)
        return None, cmd.Declare(name, count, dtype, parts, spec, Future(f"declare tensor {name!r}"), layout,
                                 start(None, len(parts)) if start is not None else None)

    def _start(self, name: str, count: int, dtype: str, spec: CodecSpec | None, layout: RowLayout | None,
               start: Callable[[Tensor | None, int], cmd.StartPushPull]) -> Future:
        """Start the push_pull ``start(tensor, partitions)`` makes; where ``name`` is not
        declared yet, it starts on the communication thread once it is, and the caller does
        not wait (``declarations.py``: workers may first use tensors in different orders)."""
        t, declaring = self._declaration(name, count, dtype, spec, layout, start)
        command = declaring if t is None else start(t, len(t.parts))
        self.comm.submit(command)
        return command.start.job.future if t is None else command.job.future

    @property
    def tensors(self) -> dict[str, Tensor]:
        """Every tensor this worker has declared, by name."""
        return dict(self.comm.table.tensors)

    def pending_loaded(self) -> dict[str, tuple[Any, dict | None]]:
        """The states loaded for tensors this job has not declared (yet): name -> (this worker's
        compressor state, the servers' states)."""
        return self.comm.table.pending()

    def took_loaded(self, name: str) -> bool:
        """Whether ``name``, declared in this job (since released, perhaps), took the states
        loaded for it before (``load_compressor_state``, ``load_server_state``)."""
        return name in self.comm.table.took_loaded

    def tensor(self, name: str) -> Tensor | None:
        """The declared tensor ``name`` (keys, partitions, compressor), or None."""
        return self.comm.table.tensors.get(name)

    def compressor_state(self, name: str) -> Any:
        """This worker's compressor state of ``name`` (residuals, momenta, learning rates) by
        partition index, for checkpoints; None if it is uncompressed and none was loaded.
        Call it between steps: the state changes only while a push is being compressed."""
        return self.comm.table.compressor_state(name)

    def load_compressor_state(self, name: str, state: Any) -> None:
        """Restore what ``compressor_state`` returned; before ``name`` is declared, it is kept
        and installed when it is."""
        t = self.comm.table.tensors.get(name)
        if t is not None:  # check here, so that the caller gets the error
            by_key(state, {wk.index: wk.key for wk in t.keys}, f"compressor state of tensor {name!r}")
        fut = Future(f"load the compressor state of tensor {name!r}")
        self.comm.submit(cmd.LoadCompressorState(name, state, fut))
        fut.result(self.s.op_timeout_s)

    def server_state(self, name: str) -> dict[int, tuple[np.ndarray | None, float | None]]:
        """The servers' error-feedback state of tensor ``name``, per partition (for checkpoints);
        for a tensor not declared yet, the state loaded for it.

        Call it between steps: a key's state changes only when one of its rounds completes.
        """
        t = self.comm.table.tensors.get(name)
        if t is None:
            pending = self.comm.table.pending_server_state(name)
            if pending is None:
                raise ValueError(f"tensor {name!r} was never declared on this worker")
            return pending
        fut = Future(f"server state of tensor {name!r}")
        self.comm.submit(cmd.GetServerState(t, fut))
        return fut.result(self.s.op_timeout_s + 5)

    def load_server_state(self, name: str, states: dict[int, tuple[np.ndarray, float | None]]) -> None:
        """Restore the servers' state of ``name`` (per partition); it reaches each server
        just before the key's next push (kept until ``name`` is declared, if it is not yet)."""
        t = self.comm.table.tensors.get(name)
        if t is not None:
            check_server_states(t, states)
        fut = Future(f"load the server state of tensor {name!r}")
        self.comm.submit(cmd.LoadServerState(name, dict(states), fut))
        fut.result(self.s.op_timeout_s)

    def release(self, names: list[str], servers: bool) -> None:
        """Forget tensors ``names``, which no worker will use again (an old plan's groups):
        their keys and this worker's compressor states; with ``servers`` (one worker, once
        every worker has left them), the servers drop their keys' sums, residuals and shared
        result memory too.
        Names never declared here are skipped. Call it between steps.

        Raises:
            ValueError: a push_pull of one of them is still in flight (nothing is released).
        """
        fut = Future(f"release of tensors {names[:3]}")
        self.comm.submit(cmd.Release(list(names), servers, fut))
        fut.result(self.s.op_timeout_s)

    def push_pull_async(self, name: str, src, out, divisor: int, priority: int,
                        spec: CodecSpec | None = None, lr: float | None = None, ready=None) -> Future:
        """Start summing ``src`` over all workers into ``out`` (divided by ``divisor``).

        ``src`` and ``out`` are 1-D contiguous arrays of the same dtype and size (they may
        be the same array; torch CUDA tensors where ``spec`` compresses on the GPU);
        neither may be touched until the returned future is done. ``spec`` is the
        tensor's compression, ``lr`` the learning rate for corrected error feedback;
        ``ready``, when given, is waited for (``ready.synchronize()``) on the communication
        thread before ``src`` is read (a CUDA event after the copy that fills it).
        """
        if spec is not None and is_device_array(src):  # its CUDA kernels compiled here, not on the comm thread
            ready_on_gpu(spec, src)

        def start(tensor: Tensor | None, parts: int) -> cmd.StartPushPull:
            job = PushPull(tensor, src, out, divisor, Future(f"push_pull of tensor {name!r}"), parts, lr, ready)
            return cmd.StartPushPull(job, priority)
        return self._start(name, int(src.numel() if hasattr(src, "numel") else src.size), _dtype_name(src), spec,
                           None, start)

    def push_pull_sparse_async(self, name: str, rows: SparseRows, layout: RowLayout, divisor: int,
                               priority: int, future: Future | None = None) -> Future:
        """Start summing row-sparse ``rows`` (``coalesce``d) over all workers; the future
        (``future`` where given) gives a ``SparseResult`` whose ``rows()`` is the union,
        divided by ``divisor``."""
        self._check_row_layout(name, layout)
        dtype = rows.values.dtype.name
        future = future if future is not None else Future(f"push_pull of sparse tensor {name!r}")

        def start(tensor: Tensor | None, parts: int) -> cmd.StartPushPull:
            job = PushPull(tensor, SparseShares(rows, layout), SparseResult(layout, dtype, divisor), divisor,
                           future, parts)
            return cmd.StartPushPull(job, priority)
        return self._start(name, layout.num_servers, dtype, None, layout, start)

    def push_pull_sparse_later(self, name: str, find_rows: Callable[[], SparseRows], layout: RowLayout,
                               divisor: int, priority: int) -> Future:
        """``push_pull_sparse_async`` of the rows ``find_rows()`` gives, found on the row
        finder's thread (``row_finder.py``: a GPU gradient's rows, which wait for the device);
        returns at once. A failure to find them, or to start, fails the future."""
        self._check_row_layout(name, layout)
        future = Future(f"push_pull of sparse tensor {name!r}")

        def find_then_start() -> None:
            try:
                self.push_pull_sparse_async(name, find_rows(), layout, divisor, priority, future)
            except (JobError, ValueError) as e:  # the job ended meanwhile, or bad rows: their own words
                future.fail(e)
            except Exception as e:  # noqa: BLE001 - a CUDA error: the caller gets it from the future
                error = RuntimeError(f"push_pull of sparse tensor {name!r}: finding its rows failed: "
                                     f"{type(e).__name__}: {e}")
                error.__cause__ = e
                future.fail(error)
        self.row_finder.submit(find_then_start)
        return future

    def _check_row_layout(self, name: str, layout: RowLayout) -> None:
        if layout.num_servers != self.book.num_servers:
            raise ValueError(f"tensor {name!r}: a row layout over {layout.num_servers} servers; "
                             f"the job has {self.book.num_servers}")

    def barrier(self, group: str = "worker") -> None:
        fut = Future(f"barrier of group {group!r}")
        self.comm.submit(cmd.Barrier(group, fut))
        fut.result(self.s.op_timeout_s)

    def abort(self, reason: str, wait_s: float = 2.0) -> None:
        """This worker failed (``reason``: its first error line): tell the scheduler, which
        stops every other node at once, and wait up to ``wait_s`` for its acknowledgement."""
        if self.fatal is not None or self.comm.stopped.is_set() or not self.comm.is_alive():
            return  # the job is already ending, or this worker never joined it
        self.aborted = True
        self.comm.submit(cmd.Abort(reason))
        self.comm.stopped.wait(wait_s)

    def finish(self) -> None:
        """Tell the scheduler this worker is done and wait for the job to end (deadline applies)."""
        if self.aborted:  # this worker failed: nothing to wait for, even if the scheduler never answered
            self.comm.stopped.set()
            self.comm.wake()
        if self.comm.stopped.is_set():  # (a fatal error): its GPU clean-up may still run
            self.comm.join(timeout=DRAIN_S + 3)
            return
        fut = Future("shutdown (waiting for every worker to finish)")
        self.comm.submit(cmd.Finish(fut, self.row_finder.busy()))
        try:
            fut.result(self.s.op_timeout_s)
        finally:
            self.row_finder.close()
            self.comm.stopped.set()
            self.comm.wake()
            # its GPU work drained (DRAIN_S), its aborts delivered (up to 2 s): before the
            # interpreter's exit finalizes the pinned memory a queued copy may still read
            self.comm.join(timeout=DRAIN_S + 3)
