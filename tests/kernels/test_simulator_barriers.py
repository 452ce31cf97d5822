"""The simulator's fast path (tests/support/block_threads.py): a kernel whose threads may
wait for each other, directly or through any function it calls, runs a thread per CUDA
thread; only one that never meets runs its threads one after another."""
import sys
import types
from pathlib import Path

from numba import cuda

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))
import block_threads  # noqa: E402
from numba.cuda.simulator import kernel  # noqa: E402


def _device(fn):
    return kernel.FakeCUDAKernel(fn, device=True)


def _plain_add(a, i):
    cuda.atomic.add(a, 0, a[i])
    cuda.threadfence()


def _waits(a, i):
    a[i] = 1
    cuda.syncthreads()


def _votes(a, i):
    return cuda.ballot_sync(0xFFFFFFFF, a[i] > 0)


helpers = types.ModuleType("helpers")  # reached as a module's attribute, as ``norms.load`` is
helpers.plain_add, helpers.waits, helpers.votes = _device(_plain_add), _device(_waits), _device(_votes)
plain_add = helpers.plain_add


def _kernel_direct(a):
    a[cuda.threadIdx.x] = 0
    cuda.syncthreads()


def _kernel_through_module(a):
    helpers.plain_add(a, cuda.threadIdx.x)
    helpers.waits(a, cuda.threadIdx.x)


def _kernel_warp(a):
    a[0] = helpers.votes(a, cuda.threadIdx.x)


def _kernel_in_comprehension(a):
    return [cuda.syncthreads() for _ in range(2)]


def _kernel_alone(a):
    plain_add(a, cuda.threadIdx.x)
    helpers.plain_add(a, cuda.threadIdx.x)
    a[cuda.threadIdx.x] += 1


def _recursive(a, i):
    if i > 0:
        recursive(a, i - 1)


recursive = _device(_recursive)


def _kernel_recursing(a):
    recursive(a, 3)


def _meets(fn) -> bool:
    return block_threads._code_meets(fn.__code__, fn.__globals__, set())


def test_kernels_whose_threads_meet_are_found_however_they_reach_the_barrier():
    assert _meets(_kernel_direct)
    assert _meets(_kernel_through_module)
    assert _meets(_kernel_warp)
    assert _meets(_kernel_in_comprehension)


def test_a_kernel_of_atomics_and_fences_alone_runs_its_threads_in_turn():
    assert not _meets(_kernel_alone)
    assert not _meets(_kernel_recursing)  # a cycle ends
