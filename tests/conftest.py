import pytest

from cluster import LocalCluster


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
