"""Keys and partitions, and placement balanced by bytes."""
import random

import pytest

from gradpress.placement import MAX_PARTITIONS, KeyPlacement, make_key, partition_counts, split_key


def test_keys_pack_tensor_and_partition():
    for t, i in [(0, 0), (1, 0), (3, 65535), (2**40, 17)]:
        assert split_key(make_key(t, i)) == (t, i)
    assert make_key(3, 2) == (3 << 16) | 2


@pytest.mark.parametrize("count,itemsize,pbytes,want", [
    (10, 4, 16, [4, 4, 2]), (8, 4, 16, [4, 4]), (1, 8, 16, [1]), (0, 4, 16, [0]),
    (5, 2, 3, [1] * 5), (1_000_000, 4, 4096000, [1_000_000]),
])
def test_partition_counts(count, itemsize, pbytes, want):
    assert partition_counts(count, itemsize, pbytes) == want


def test_too_many_partitions_is_a_clear_error():
    with pytest.raises(ValueError, match="BYTEPS_PARTITION_BYTES"):
        partition_counts(MAX_PARTITIONS + 1, 4, 4)


def test_greedy_placement_balances_bytes_within_one_partition():
    rng = random.Random(0)
    sizes = [rng.choice([4, 400, 40_000, 4_096_000]) for _ in range(300)]
    p = KeyPlacement(3)
    servers = p.place(sizes)
    assert max(p.load) - min(p.load) <= max(sizes)
    assert [sum(s for s, v in zip(sizes, servers) if v == k) for k in range(3)] == p.load
    # deterministic: the same sequence places the same way
    assert KeyPlacement(3).place(sizes) == servers


def test_hash_placement_would_not_balance_but_ours_does():
    # one huge tensor and many small ones: bytes, not key counts, decide
    p = KeyPlacement(2)
    assert p.place([1000, 1, 1, 1, 1]) == [0, 1, 1, 1, 1]
