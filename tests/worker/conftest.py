"""Fixtures of the worker tests that script their peers (tests/support/fake_peers.py)."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from fake_peers import FakePeers


@pytest.fixture
def peers():
    """A scheduler and two servers the test plays, message by message."""
    p = FakePeers(servers=2)
    yield p
    p.close()


@pytest.fixture
def calls():
    """Run blocking client calls off the test thread (the test plays the peers meanwhile)."""
    with ThreadPoolExecutor(4) as pool:
        yield pool
