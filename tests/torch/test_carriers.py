"""Tensors that travel as another (gradpress/torch/carriers.py): what travels, where it lands,
and on which device. Values through real jobs: test_pushpull_integ.py and tests/gpu."""
import pytest
import torch

from gradpress.torch import carriers, exact_ints


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64])
def test_a_devices_64_bit_integers_travel_summed_as_float64_halves_made_there(dtype):
    x = torch.zeros(5, 3, dtype=dtype, device="meta")
    c = carriers.carrier(x, x, compressed=False, divisor=4)
    assert c.summed and c.travels is c.lands_in and c.land is not None
    assert c.travels.device.type == "meta" and c.travels.dtype == torch.float64 and c.travels.shape == (30,)


def test_the_landing_joins_the_halves_and_floor_divides_into_the_output(monkeypatch):
    # a fake device holds no values: the carrier's halves are made on the host here, holding
    # what two workers' halves sum to, as the job leaves them
    values = [torch.tensor([[-3, 2**53 + 1], [7, -(2**62)]]), torch.tensor([[0, 2**53], [0, 2**62 - 1]])]
    summed = sum(exact_ints.split(v) for v in values)
    monkeypatch.setattr(exact_ints, "split", lambda t: summed)
    out = torch.empty(2, 2, dtype=torch.int64)
    c = carriers.carrier(torch.zeros(2, 2, dtype=torch.int64, device="meta"), out, compressed=False, divisor=2)
    c.land()
    assert out.tolist() == [[-2, (2**54 + 1) // 2], [3, -1]]


def test_on_the_host_or_compressed_integers_travel_as_themselves():
    assert carriers.carrier(torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), False, 2) is None
    meta = torch.zeros(3, dtype=torch.int64, device="meta")
    assert carriers.carrier(meta, meta, True, 2) is None   # (refused by the codec's dtype check, by name)


def test_complex_travels_as_its_real_view_and_halves_widen_only_to_be_compressed():
    z = torch.zeros(4, dtype=torch.complex64)
    c = carriers.carrier(z, z, False, 2)
    assert c.travels.shape == (4, 2) and c.land is None and not c.summed
    h = torch.zeros(4, dtype=torch.bfloat16)
    assert carriers.carrier(h, h, False, 2) is None
    c = carriers.carrier(h, h, True, 2)
    assert c.travels.dtype == torch.float32 and not c.summed


def test_a_sparse_tensor_travels_as_its_rows_never_by_a_carrier():
    """A complex sparse COO tensor's real view is a sparse tensor of another shape: its
    sums came back in a new tensor while the caller got the empty output; a CUDA int64 one
    failed in a reshape. Rows refuse what they cannot carry, by name."""
    import pytest

    from gradpress.torch import carriers, sparse
    index = torch.tensor([[0, 2]])
    for values, device in ((torch.ones(2, dtype=torch.complex64), "cpu"), (torch.ones(2, dtype=torch.int64), "meta")):
        t = torch.sparse_coo_tensor(index, values, (4,), device=device, check_invariants=False)
        for compressed in (False, True):
            assert carriers.carrier(t, t, compressed, 2) is None, (t.dtype, compressed)
    complex_rows = torch.sparse_coo_tensor(index, torch.ones(2, dtype=torch.complex64), (4,))
    with pytest.raises(ValueError, match="'emb': a row-sparse torch.complex64 tensor"):
        sparse.rows_of_coo(complex_rows, "emb")
