"""Freed memory kept for reuse (gradpress/allocator.py): large blocks stop costing page faults."""
import subprocess
import sys

import pytest

from gradpress.config import Settings

# Allocates, touches and frees a 64 MB tensor (a 4096x4096 gradient's size) 16 times and prints
# the page faults of the last four: a fresh mmap faults in all 16,384 pages each time. A heap
# that keeps freed memory grows by a few blocks first (torch asks for 64-byte alignment, so a
# freed block is a little too small for the next request until free neighbours merge with it:
# 8 blocks here), then serves every step from them. (torch, not numpy: numpy asks for huge
# pages, 2 MB per fault, on blocks this large.)
FAULTS = """
import resource, torch
def step():
    a = torch.ones(16 << 20)
    del a
for _ in range(12):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    step()
print("FAULTS", (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 4, flush=True)
"""
PAGES = (64 << 20) // 4096


def faults(prelude: str) -> int:
    out = subprocess.run([sys.executable, "-c", prelude + FAULTS], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split("FAULTS")[-1])


@pytest.mark.integ  # starts processes
def test_a_freed_large_block_is_reused_without_page_faults():
    assert faults("") >= PAGES  # malloc as it is: fresh pages every time
    kept = faults("from gradpress.allocator import keep_freed_memory\nassert keep_freed_memory()\n")
    assert kept < PAGES // 100, f"{kept} page faults per 64 MB block with freed memory kept"


def test_the_setting_is_on_by_default_and_can_be_turned_off():
    assert Settings.load({}).keep_freed_memory is True
    assert Settings.load({"GRADPRESS_KEEP_FREED_MEMORY": "0"}).keep_freed_memory is False


# a worker's process: gradpress set malloc up at init (or left it alone)
WORKER = """
import torch, gradpress.torch as bps
bps.init()
assert torch.equal(bps.push_pull(torch.ones(3), average=False, name="x"), torch.full((3,), 2.0))
""" + FAULTS


@pytest.mark.integ
def test_a_worker_keeps_freed_memory_unless_told_not_to(cluster):
    """One job: worker 0 with the default, worker 1 with the setting at 0."""
    c = cluster(workers=2, servers=1).start(WORKER, each_worker=[{}, {"GRADPRESS_KEEP_FREED_MEMORY": "0"}])
    c.assert_success()
    kept, plain = (int(c.log(f"worker {i}").split("FAULTS")[-1].split()[0]) for i in range(2))
    assert kept < PAGES // 100 and plain >= PAGES, (kept, plain)
