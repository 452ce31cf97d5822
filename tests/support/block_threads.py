"""A simulated block's threads released at ``syncthreads`` by a condition, not by polling.

Numba's CUDA simulator runs each CUDA thread of a block as a Python thread, and a manager
thread spins over all of them (``is_alive``, a flag each) until every live one is blocked
in ``syncthreads``, then releases them. On 2 cores that spin takes the GIL from the threads
it waits for: most of a simulator script's time went to it (ten million ``is_alive``
calls in the payload script). Here the last thread to arrive releases the others, and a
thread that ends counts as arrived, as in the simulator: the same barrier, without the spin.
The OS threads are kept from block to block (a pool per launching thread) instead of one
started per CUDA thread.

A kernel that never meets at a barrier (neither it nor any function it calls names
``syncthreads``, a warp collective or a cooperative group: ``_meets``) has its block's
threads run one after another on one pooled thread instead, in the same order: a
GPU may run them in any order, and each OS thread handed a CUDA thread cost two context
switches, most of a simulator script's system time.

The threads start in ``kernel.np.ndindex``'s order (block_order.py shuffles it), and an
exception in any thread aborts the block's others and is raised from the launch, with its
thread and block named, as the simulator does.
"""
import threading
import types

from numba.cuda.simulator import kernel

_ABORTED = "abort flag set on syncthreads call"
BLOCK_DEADLINE_S = 600  # one block's threads, all of them: a kernel stuck in a loop fails here


class _Barrier:
    """The block's count of live threads and of those waiting at ``syncthreads``."""

    def __init__(self, threads: int) -> None:
        self.cond = threading.Condition()
        self.live, self.waiting, self.generation = threads, 0, 0
        self.aborted = False
        self.ended = threading.Event()   # the last thread has left

    def _release_if_all_arrived(self) -> None:  # with cond held
        if self.waiting and self.waiting == self.live:
            self.waiting = 0
            self.generation += 1
            self.cond.notify_all()

    def arrive(self) -> None:
        with self.cond:
            if self.aborted:
                raise RuntimeError(_ABORTED)
            generation = self.generation
            self.waiting += 1
            self._release_if_all_arrived()
            while self.generation == generation and not self.aborted:
                self.cond.wait()
            if self.aborted:
                raise RuntimeError(_ABORTED)

    def leave(self, failed: bool) -> None:
        with self.cond:
            self.live -= 1
            if failed and not self.aborted:
                self.aborted = True
                self.cond.notify_all()   # the waiting ones raise
            self._release_if_all_arrived()
            if not self.live:
                self.ended.set()


class _Thread(kernel.BlockThread):
    """One OS thread that runs CUDA threads one after another, each of some block: starting
    a fresh thread for each (150,000 in the payload script) cost a third of the run."""

    def __init__(self) -> None:
        threading.Thread.__init__(self, daemon=True)   # the simulator's fields are set per task
        self._given = threading.Event()
        self._barrier: _Barrier | None = None

    def give(self, f, manager, block, thread, barrier: _Barrier) -> None:
        self._target, self._args, self._kwargs = f, (), {}
        self._manager, self._barrier = manager, barrier
        self.blockIdx = kernel.Dim3(*block)
        self.place(thread)
        self.exception, self.abort = None, False
        self._given.set()

    def place(self, thread) -> None:
        """Be CUDA thread ``thread`` of the block given."""
        self.threadIdx = kernel.Dim3(*thread)
        x, y, _ = self._manager._block_dim
        self.thread_id = thread[0] + x * (thread[1] + y * thread[2])

    def run(self) -> None:
        while True:
            self._given.wait()
            self._given.clear()
            kernel.BlockThread.run(self)   # the simulator's: an exception is kept in self.exception
            self._barrier.leave(failed=self.exception is not None)

    def syncthreads(self) -> None:
        self._barrier.arrive()


_pools = threading.local()  # each launching thread its own (a worker's threads may launch at once)


# names that make threads wait for each other: barriers, warp collectives, cooperative groups
_MEETING = ("sync", "shfl", "ballot", "activemask", "cg", "this_grid")
_meets: dict = {}  # a kernel's code object -> whether its threads may wait for each other


def _code_meets(code, scope: dict, seen: set) -> bool:
    """Whether ``code`` (a function's, its globals ``scope``) or anything it calls may wait
    for the block's other threads; a function already in ``seen`` is being answered by an
    earlier call."""
    if code in seen:
        return False
    seen.add(code)
    names = set(code.co_names)
    meets = any(name.startswith(_MEETING) for name in names)
    callees = [scope.get(name) for name in names]
    callees += [getattr(module, name, None) for module in callees if isinstance(module, types.ModuleType)
                for name in names]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            meets = meets or _code_meets(const, scope, seen)
    for callee in callees:
        if isinstance(callee, kernel.FakeCUDAKernel):
            callee = callee.fn
        if isinstance(callee, types.FunctionType):
            meets = meets or _code_meets(callee.__code__, callee.__globals__, seen)
    return meets


def _run(self, grid_point, *args) -> None:
    assert not self._debug, "block_threads.py does not run the simulator's debug mode"
    points = list(kernel.np.ndindex(*self._block_dim))
    code = self._f.__code__
    apart = _meets.get(code)
    if apart is None:
        apart = _meets[code] = _code_meets(code, self._f.__globals__, set())
    pool = _pools.__dict__.setdefault("threads", [])
    while len(pool) < (len(points) if apart else 1):
        pool.append(_Thread())
        pool[-1].start()
    if apart:
        barrier = _Barrier(len(points))
        threads = pool[:len(points)]
        for t, point in zip(threads, points):
            t.give(lambda: self._f(*args), self, grid_point, point, barrier)
    else:  # one after another: nothing in the kernel waits for another thread
        barrier, threads = _Barrier(1), pool[:1]

        def in_turn(t=threads[0]):
            for point in points:
                t.place(point)
                self._f(*args)
        threads[0].give(in_turn, self, grid_point, points[0], barrier)
    if not barrier.ended.wait(BLOCK_DEADLINE_S):
        raise TimeoutError(f"{self._f.__qualname__}: block {grid_point} still running after {BLOCK_DEADLINE_S} s "
                           f"({barrier.live} of {len(points)} threads, {barrier.waiting} at a barrier)")
    failed = [t for t in threads if t.exception]
    # the first to fail, not one that an abort made fail after it
    first = next((t for t in failed if _ABORTED not in str(t.exception[0])), failed[0]) if failed else None
    if first is not None:
        raise first.exception[0].with_traceback(first.exception[1])


def install() -> None:
    """Before any kernel runs."""
    # a numba whose block manager moved would keep its polling without a word: say so instead
    assert callable(getattr(kernel.BlockManager, "run", None)) and hasattr(kernel.BlockThread, "syncthreads"), \
        "numba's CUDA simulator changed: tests/support/block_threads.py replaces nothing"
    kernel.BlockManager.run = _run
