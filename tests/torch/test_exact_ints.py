"""64-bit integers through float64 sums (exact_ints.py): split on every worker, the halves
summed in float64 as a server sums them, joined: the exact sum modulo 2**64."""
import numpy as np
import pytest
import torch

from gradpress.torch import exact_ints

EDGES = [0, 1, -1, 2**31, -(2**31), 2**32 - 1, 2**32, 2**53 + 1, -(2**53) - 1, 2**63 - 1, -(2**63)]


def wrapped(value: int) -> int:
    return (value + 2**63) % 2**64 - 2**63


@pytest.mark.parametrize("workers", [1, 2, 7, 64])
def test_the_sum_of_split_values_joins_to_the_exact_sum_modulo_2_64(workers):
    rng = np.random.default_rng(workers)
    shares = [torch.tensor(EDGES + rng.integers(-(2**63), 2**63 - 1, 200, dtype=np.int64,
                                                endpoint=True).tolist(), dtype=torch.int64)
              for _ in range(workers)]
    total = np.zeros(2 * shares[0].numel(), np.float64)
    for share in shares:  # in order, in float64, as the servers add the pushes
        total += exact_ints.split(share).numpy()
    joined = exact_ints.join(torch.from_numpy(total), torch.int64)
    want = [wrapped(sum(int(s[i]) for s in shares)) for i in range(shares[0].numel())]
    assert joined.tolist() == want


def test_uint64_shares_int64s_bits_and_any_shape_comes_back_flat():
    x = torch.tensor([[2**64 - 1, 2**63 + 5], [0, 7]], dtype=torch.uint64)
    halves = exact_ints.split(x)
    assert halves.dtype == torch.float64 and halves.shape == (8,)
    assert torch.equal(exact_ints.join(halves, torch.uint64), x.reshape(-1))
    doubled = exact_ints.join(2 * halves, torch.uint64).view(torch.int64).tolist()
    assert doubled == [wrapped(2 * int(v)) for v in x.reshape(-1).view(torch.int64).tolist()]


@pytest.mark.parametrize("divisor", [1, 2, 3, 7, 1000, 2**20])
def test_floor_division_of_int64_and_of_uint64_which_torch_does_not_divide(divisor):
    rng = np.random.default_rng(divisor)
    signed = EDGES + rng.integers(-(2**63), 2**63 - 1, 500, dtype=np.int64, endpoint=True).tolist()
    got = exact_ints.floor_divided(torch.tensor(signed, dtype=torch.int64), divisor).tolist()
    assert got == [v // divisor for v in signed]
    unsigned = [v % 2**64 for v in signed] + [2**64 - 1, 2**63, 2**63 - 1]
    bits = torch.tensor([wrapped(v) for v in unsigned], dtype=torch.int64).view(torch.uint64)
    got = exact_ints.floor_divided(bits, divisor)
    assert got.dtype == torch.uint64 and got.view(torch.int64).tolist() == [wrapped(v // divisor) for v in unsigned]


def test_a_devices_halves_are_made_on_that_device():
    """(``meta``: a device that is not the host's, as a GPU's int64 buffers are split there)."""
    halves = exact_ints.split(torch.zeros(3, 2, dtype=torch.int64, device="meta"))
    assert halves.device.type == "meta" and halves.dtype == torch.float64 and halves.shape == (12,)
