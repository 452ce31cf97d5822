import pytest

import process_check
from cluster import LocalCluster

from gradpress.testing import netns


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
