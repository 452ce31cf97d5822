"""optim/loss_scaling.py on its own (no job): float16 gradients refused, a sparse average
checked by its values, and a GradScaler's attributes gone after a step that raised."""
import pytest
import torch

from gradpress.optim import loss_scaling


class _Stepping:
    """An optimizer as a GradScaler leaves it for one step() (``grad_scale``, ``found_inf``)."""

    def __init__(self, params):
        self.params = params
        self.grad_scale, self.found_inf = torch.tensor(4.0), torch.tensor(0.0)

    @loss_scaling.taking_scale
    def step(self):
        loss_scaling.unscale(self, self.params)


def test_gradients_are_unscaled_in_place_and_float16_ones_refused():
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([4.0, -8.0, 1e-30])
    opt = _Stepping([p])
    opt.step()
    assert torch.equal(p.grad, torch.tensor([1.0, -2.0, 1e-30 / 4]))  # times the float32 reciprocal
    half = torch.nn.Parameter(torch.zeros(3, dtype=torch.float16))
    half.grad = torch.full((3,), 4.0, dtype=torch.float16)
    opt = _Stepping([half])
    with pytest.raises(ValueError, match="float16 gradients"):
        opt.step()
    assert torch.equal(half.grad, torch.full((3,), 4.0, dtype=torch.float16)), "refused, yet unscaled"
    # the step raised before GradScaler could remove its attributes: removed here
    assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf") and not loss_scaling.driven(opt)


def test_a_sparse_average_is_checked_by_its_values():
    rows = torch.sparse_coo_tensor(torch.tensor([[0, 5]]), torch.tensor([[1.0, 2.0], [3.0, 4.0]]), (8, 2),
                                   check_invariants=True)
    bad = torch.sparse_coo_tensor(torch.tensor([[1]]), torch.tensor([[float("inf"), 0.0]]), (8, 2),
                                  check_invariants=True)
    assert loss_scaling.all_finite([rows, torch.ones(3)])
    assert not loss_scaling.all_finite([rows, bad])
    assert not loss_scaling.all_finite([torch.tensor([0.0, float("nan")])])


def test_this_workers_overflow_is_read_from_a_tensor_or_from_the_int_of_no_gradient():
    """torch's ``found_inf`` is the sum of the per-device flags: the int 0 where none of the
    optimizer's parameters had a gradient this step (``.item()`` would raise)."""
    opt = _Stepping([])
    for found, overflow in ((torch.tensor(0.0), False), (torch.tensor(1.0), True), (0, False)):
        opt.found_inf = found
        assert loss_scaling.driven(opt) and loss_scaling.local_overflow(opt) == overflow, found
    del opt.found_inf
    assert not loss_scaling.driven(opt) and not loss_scaling.local_overflow(opt)
