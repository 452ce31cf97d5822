"""Adam's arithmetic for ``OneBitAdam`` and ``ZeroOneAdam``, over lists of tensors.

Each function takes one parameter group's tensors and runs torch's multi-tensor
(``_foreach_``) ops: on a GPU one launch for the whole list, where a loop over the
parameters launched every op once per tensor. For the benchmark transformer (102 tensors)
a frozen OneBitAdam step's arithmetic took 918 launches and their Python on the training
thread, now 9; a ZeroOneAdam momentum step 1,326, now 216 (``benchmarks/adam_ops.py``).
The variance floor's mean and clamp stay one op each a tensor: no multi-tensor op takes
either, and a norm would sum in another order than the mean. On a host the multi-tensor
ops loop over the tensors in C++, each through the kernel the single op uses, so the bits
are those of one op at a time (tests/optim/test_adam_math.py); on a GPU a multi-tensor
kernel may round a division apart from the single op's, the same on every worker.

The callers cut every list into chunks (``chunks``): on a GPU of one device and dtype and at
most ``CHUNK_BYTES``, as the ops that make new tensors hold a chunk's worth at once; on a
host of one tensor. A float16 parameter's ops that pair it with its float32 state take
torch's per-tensor path even so: the fast one needs a single dtype across the lists.
"""
from __future__ import annotations

import torch

CHUNK_BYTES = 1 << 28  # temporaries of the multi-tensor ops: at most this many bytes at once


def chunks(tensors: list[torch.Tensor], limit: int = CHUNK_BYTES) -> list[list[torch.Tensor]]:
    """``tensors`` in chunks of one device and one dtype each, at most ``limit`` bytes (one
    tensor larger than that is a chunk of its own), in their order within each (device,
    dtype); on a host, one tensor each. Why one dtype: CUDA's ``_foreach_copy_`` took its
    kernel from the first target's dtype in some torch releases (pytorch#173383), and the
    multi-tensor kernels take their fast path only over lists of one dtype; why one device:
    the floors' stack needs one. On a host a multi-tensor op is a loop in C++ that saves
    little, and a tensor's passes one after the other find it in the cache: the
    transformer's step ran 1.2x to 2.8x slower over the whole list in five runs
    (``benchmarks/adam_ops.py``)."""
    if any(t.device.type == "cpu" for t in tensors):
        return [[t] for t in tensors]
    kinds: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        kinds.setdefault((t.device, t.dtype), []).append(t)
    out = []
    for same in kinds.values():
        start, size = 0, 0
        for i, t in enumerate(same):
            nbytes = t.numel() * t.element_size()
            if i > start and size + nbytes > limit:
                out.append(same[start:i])
                start, size = i, 0
            size += nbytes
        out.append(same[start:])
    return out


def copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """A copy of each, the dense ones in one multi-tensor copy per (device, dtype) (a launch
    each on a GPU, where ``clone`` was a launch a tensor; one dtype a call: ``chunks``); a
    sparse one cloned."""
    out = [torch.empty_like(t) if t.layout == torch.strided else t.clone() for t in tensors]
    kinds: dict[tuple, list[int]] = {}
    for i, t in enumerate(tensors):
        if t.layout == torch.strided:
            kinds.setdefault((t.device, t.dtype), []).append(i)
    for dense in kinds.values():
        torch._foreach_copy_([out[i] for i in dense], [tensors[i] for i in dense])
    return out


def momenta(exp_avgs: list[torch.Tensor], grads: list[torch.Tensor], beta1: float) -> list[torch.Tensor]:
    """``beta1 * m + (1 - beta1) * g`` of each, in new tensors (what a worker sends); ``g`` may be sparse."""
    if not exp_avgs:
        return []
    out = torch._foreach_mul(exp_avgs, beta1)
    torch._foreach_add_(out, grads, alpha=1 - beta1)
    return out


def accumulate(exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor] | None, grads: list[torch.Tensor],
               beta1: float, beta2: float) -> None:
    """In place: ``m = beta1 * m + (1 - beta1) * g`` and, unless ``exp_avg_sqs`` is None,
    ``v = beta2 * v + (1 - beta2) * g * g``. A sparse ``g`` (an embedding's, averaged as
    rows) is added to m as it is, and made dense for v: torch has no sparse ``addcmul``."""
    if not exp_avgs:
        return
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
    if exp_avg_sqs is not None:
        dense = [g.to_dense() if g.layout != torch.strided else g for g in grads]
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, dense, dense, value=1 - beta2)


def denominators(exp_avg_sqs: list[torch.Tensor], bias2s: list[float | None], eps: float,
                 floor: float = 0.0) -> list[torch.Tensor]:
    """``sqrt(v / bias2) + eps`` of each v in new tensors (``sqrt(v) + eps`` where its bias2
    is None), the root floored at ``floor`` times its own mean first where ``floor > 0``."""
    roots: list = [None] * len(exp_avg_sqs)
    plain = [i for i, b in enumerate(bias2s) if b is None]
    scaled = [i for i, b in enumerate(bias2s) if b is not None]
    if plain:
        for i, r in zip(plain, torch._foreach_sqrt([exp_avg_sqs[i] for i in plain])):
            roots[i] = r
    if scaled:
        divided = torch._foreach_div([exp_avg_sqs[i] for i in scaled], [bias2s[i] for i in scaled])
        torch._foreach_sqrt_(divided)
        for i, r in zip(scaled, divided):
            roots[i] = r
    if floor > 0:
        floors_(roots, floor)
    if roots:
        torch._foreach_add_(roots, eps)
    return roots


def floors_(roots: list[torch.Tensor], floor: float) -> list[torch.Tensor]:
    """Each root raised in place to at least ``floor`` times its own mean. The floors stay
    tensors on the roots' device: read on the host (floats) they would make the step wait
    for the device at every parameter. A mean and a clamp are one op a tensor (no
    multi-tensor op takes either); the floors are made from the means in one."""
    live = [r for r in roots if r.numel()]
    if floor > 0 and live:
        means = [r.mean() for r in live]
        # (one tensor, a host's way: no stack to make and take apart)
        floors = [means[0].mul_(floor)] if len(live) == 1 else torch.stack(means).mul_(floor)
        for r, f in zip(live, floors):
            torch.clamp_(r, min=f)
    return roots


def apply(params: list[torch.Tensor], exp_avgs: list[torch.Tensor], denoms: list[torch.Tensor],
          bias1s: list[float], lr: float, weight_decay: float) -> None:
    """``p -= lr * (m / bias1 / denom + weight_decay * p)`` of each parameter, in place."""
    if not params:
        return
    updates = torch._foreach_div(exp_avgs, bias1s)
    torch._foreach_div_(updates, denoms)
    if weight_decay:
        torch._foreach_add_(updates, params, alpha=weight_decay)
    torch._foreach_add_(params, updates, alpha=-lr)
