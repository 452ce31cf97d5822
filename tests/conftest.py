import os
import shutil
import tempfile

import pytest

import process_check
from cluster import LocalCluster

from gradpress.testing import netns

PTX_COMPILED = "GP_PTX_COMPILED"  # tests/support/ptx_check.py


def pytest_configure(config):
    """One folder for the session (the controller makes it; xdist's workers inherit it) in
    which the GPU compile check marks each kernel and signature it compiled, so that the
    simulator scripts' checks do not compile the same kernel again."""
    if not hasattr(config, "workerinput") and PTX_COMPILED not in os.environ:
        os.environ[PTX_COMPILED] = config._gp_ptx_compiled = tempfile.mkdtemp(prefix="gp-ptx-")


def pytest_unconfigure(config):
    folder = getattr(config, "_gp_ptx_compiled", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        del os.environ[PTX_COMPILED]


@pytest.fixture
def cluster(tmp_path):
    """Make clusters; every process still running at the end of the test is killed."""
    made = []

    def make(**kwargs) -> LocalCluster:
        c = LocalCluster(tmp_path / f"job{len(made)}", **kwargs)
        c.tmp.mkdir()
        made.append(c)
        return c
    yield make
    for c in made:
        c.kill()

@pytest.fixture
def namespaces():
    """Network namespaces for a job of a scheduler, a server and two workers, removed after."""
    why = netns.check_allowed()
    if why:
        pytest.skip(why)
    cluster = netns.NetnsCluster()
    try:
        cluster.start()
        for name in ("sched", "s0", "w0", "w1"):
            cluster.add_node(name)
        yield cluster
    finally:
        cluster.remove()
    assert not cluster.leftovers(), cluster.leftovers()


# every test: one that starts a process must be marked integ (support/process_check.py)
_processes_need_the_integ_marker = pytest.fixture(autouse=True)(process_check.needs_integ_marker)
