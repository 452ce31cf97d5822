"""A tensor's partitions compressed together on the device, under Numba's CUDA simulator
(in a subprocess: cudasim_partitions.py): the bits and state of the key-by-key path, the
refusals it makes, the inputs it leaves to that path, one set of launches for all."""
from pathlib import Path

import pytest
from cudasim_run import assert_case_groups

SCRIPT = Path(__file__).with_name("cudasim_partitions.py")


@pytest.mark.integ  # starts processes
@pytest.mark.timeout(300)
def test_partitions_compressed_together_match_the_key_by_key_path():
    groups = {"together/": 14, "nan/": 8, "restart/": 3, "restored": 1, "declined/": 5, "alternating/": 3,
              "views-kept": 1, "one-launch-set/": 2, "lines/": 2, "warm-up": 3}
    assert_case_groups(SCRIPT, 280, groups, "together and key by key")
