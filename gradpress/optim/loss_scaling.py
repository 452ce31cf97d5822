"""Mixed precision's loss scaling (``torch.amp.GradScaler``) driving a ``CompressedAdam``.

Left to itself, a GradScaler skips ``optimizer.step()`` on a worker whose own gradients
overflowed. Here that takes the worker out of the step's push_pulls while the others push:
their rounds pair with its next step's, and the optimizers' phases drift apart until a
deadline fails the job. So these optimizers take the scaling themselves, as torch's fused
Adam does (``_step_supports_amp_scaling``): the scaler then calls ``step()`` on every worker,
having set ``grad_scale`` (None where ``unscale_`` ran already) and this worker's
``found_inf`` on the optimizer. The step unscales the gradients, communicates as always,
and skips its update on every worker alike where an average it pulled is not finite (the
overflow reaches every worker's average: uncompressed as inf or NaN, compressed as a
skipped round, ``worker/nonfinite.py``); a skipped step changes neither the parameters nor
the optimizer's moments, and is not counted (the keys whose rounds went through keep the
error-feedback step they took, alike on every worker; a skipped round's key restarts). A
step without communication (``ZeroOneAdam``'s local steps) knows only this worker's
``found_inf``: that worker alone skips its update, and counts the step, so every worker's
schedule stays alike (the parameters differ between syncs anyway).

Each worker's scaler reads its own ``found_inf``, so the workers' scales may differ; each
unscales its own gradients before anything travels, so no average depends on them.
float16 gradients are refused, as ``GradScaler.unscale_`` refuses them: unscaled in float16,
the small ones loss scaling exists to keep would flush to zero.
"""
from __future__ import annotations

import functools
from typing import Callable, Iterable

import torch


def taking_scale(step: Callable) -> Callable:
    """An optimizer's ``step``, after which no scaler's attributes stay behind: GradScaler
    removes ``grad_scale`` and ``found_inf`` only once step() returns, so a step that raised
    would leave them, and a later step without a scaler would be taken for a scaled one."""
    @functools.wraps(step)
    def stepped(optimizer, *args, **kwargs):
        try:
            return step(optimizer, *args, **kwargs)
        except BaseException:
            forget(optimizer)
            raise
    return stepped


def forget(optimizer) -> None:
    """Remove what a GradScaler set on ``optimizer`` for one step()."""
    for name in ("grad_scale", "found_inf"):
        optimizer.__dict__.pop(name, None)


def driven(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a GradScaler is calling this step (it sets ``found_inf`` for the call)."""
    return getattr(optimizer, "found_inf", None) is not None


def unscale(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor]) -> None:
    """Divide the gradients by the scaler's scale, as ``GradScaler.unscale_`` does (times
    the float32 reciprocal), where it has not done so itself."""
    scale = getattr(optimizer, "grad_scale", None)
    if scale is None:
        return
    inverse = scale.double().reciprocal().float()
    by_device: dict = {}
    for p in params:
        if p.grad is None:
            continue
        if p.grad.dtype == torch.float16:
            raise ValueError(f"{type(optimizer).__name__}: loss scaling with float16 gradients: unscaled in float16, "
                             "the small ones would flush to zero (GradScaler.unscale_ refuses them too); keep the "
                             "parameters float32 and run the forward pass under torch.autocast")
        by_device.setdefault(p.grad.device, []).append(p.grad)
    for device, grads in by_device.items():
        torch._foreach_mul_(grads, inverse.to(device))


def local_overflow(optimizer: torch.optim.Optimizer) -> bool:
    """Whether this worker's own gradients overflowed (False where no scaler drives the step).
    (``found_inf`` is torch's sum over the devices of the gradients: the int 0 where no
    parameter had a gradient.)"""
    found = getattr(optimizer, "found_inf", None)
    return found is not None and bool(found.item() if torch.is_tensor(found) else found)


def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether every element of ``tensors`` is finite (one host wait per device); a sparse
    average (an embedding's rows) by its values."""
    by_device: dict = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(torch.isfinite(t._values() if t.is_sparse else t).all())
    return all(bool(torch.stack(flags).all()) for flags in by_device.values())
