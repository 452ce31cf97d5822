"""Keys, partitions, and which server owns each partition.

Partition ``i`` of tensor ``t`` has key ``(t << 16) | i``. Partitions go to the
server holding the fewest bytes so far (ties to the lowest rank): balanced by
construction, unlike a hash of the key. The scheduler is the only place that
places keys, so every worker sees the same placement whatever order it declares
tensors in.
"""
from __future__ import annotations

PARTITION_BITS = 16
MAX_PARTITIONS = 1 << PARTITION_BITS


def make_key(tensor_id: int, partition: int) -> int:
    return (tensor_id << PARTITION_BITS) | partition


def split_key(key: int) -> tuple[int, int]:
    return key >> PARTITION_BITS, key & (MAX_PARTITIONS - 1)


def partition_counts(count: int, itemsize: int, partition_bytes: int) -> list[int]:
    """Element counts of the partitions of a tensor of ``count`` elements.

    A 0-element tensor has one empty partition, so every tensor has at least one key.
    """
    per = max(1, partition_bytes // itemsize)
    if count == 0:
        return [0]
    parts = [per] * (count // per)
    if count % per:
        parts.append(count % per)
    if len(parts) > MAX_PARTITIONS:
        raise ValueError(f"{count} elements make {len(parts)} partitions of {partition_bytes} bytes; "
                         f"at most {MAX_PARTITIONS} (raise BYTEPS_PARTITION_BYTES)")
    return parts


class KeyPlacement:
    """Greedy by bytes: each new partition goes to the least-loaded server."""

    def __init__(self, num_servers: int):
        self.load = [0] * num_servers

    def place(self, partition_bytes: list[int]) -> list[int]:
        servers = []
        for nbytes in partition_bytes:
            s = min(range(len(self.load)), key=lambda i: (self.load[i], i))
            self.load[s] += nbytes
            servers.append(s)
        return servers
