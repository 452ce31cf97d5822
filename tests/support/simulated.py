"""What every script under Numba's CUDA simulator sets up before its first kernel (the
scripts cudasim_run.py runs, and the worker scripts of jobs under the simulator, which
begin with ``JOB_PREAMBLE``)."""
from pathlib import Path

# the first lines of a job's worker script run with NUMBA_ENABLE_CUDASIM=1: each worker
# process prepares its own simulator (numba's stock one polls every block's threads)
JOB_PREAMBLE = f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n" \
    "import simulated\nsimulated.prepare()\n"


def prepare() -> None:
    import block_order
    import block_threads
    import cudasim_races
    import kernel_arrays
    import kernel_signatures

    cudasim_races.install()      # two simulator races closed
    kernel_signatures.record()   # what is launched, to compile for a GPU after (cudasim_run.py)
    block_order.shuffle()        # blocks in any order, as on a GPU
    block_threads.install()      # a block's threads meet at a barrier, not a polling loop
    kernel_arrays.install()      # a kernel's arrays unwrapped: the same elements, read directly
