"""top-k with error feedback over every partition of a tensor at once (``ErrorFeedback.
compress_partitions``): the kernels of ``topk`` with the grid's second dimension the
partition, so that one set of nine launches and one copy serve all of them instead of a
set per partition. Each partition keeps its own state (estimate, candidates, radix digits,
NaN flag), its own k and the CPU's tie rule, so its pairs are the bits ``topk`` gives it
alone. The scratch is one buffer per role grown to the largest tensor
(``scratch.grown``), not one per tensor size."""
from typing import Any

import numpy as np
from numba import cuda

from gradpress.kernels.cuda import device, scratch
from gradpress.kernels.cuda.compensation import compensated
from gradpress.kernels.cuda.device import THREADS, blocks
from gradpress.kernels.cuda.topk import _select
from gradpress.kernels.cuda.topk_radix import NONFINITE, STATE


@cuda.jit(cache=True)
def _compensate_states(g, e, lam, seg_len, e_out, state, epoch):
    """e_out = p = g + lam * e; on a NaN/inf, the NaN flag of the element's segment's state
    becomes ``epoch`` (an earlier call's flag holds another number: nothing clears it)."""
    i = cuda.grid(1)
    if i < e_out.shape[0]:
        p = compensated(g[i], lam, e[i])
        e_out[i] = p
        if not abs(p) < np.inf:
            state[(i // seg_len) * STATE + NONFINITE] = epoch


def _grown(role: str, count: int, dtype: Any) -> Any:
    return scratch.grown(f"segments-{role}", (max(count, 1),), dtype)


def select_feedback_segments(g, e, lam: float, e_out, seg_len: int, k: int, k_last: int,
                             reuse: np.ndarray | None) -> tuple[list, np.ndarray]:
    """``topk.select_topk_feedback`` of every segment of ``seg_len`` elements of g at once,
    keeping k of each but the last and ``k_last`` of that. Returns per segment its (local
    indices, values), None where its p is not finite (its part of e_out then holds garbage;
    e_out must not be e), and the pinned host array behind them: ``reuse`` where it fits,
    which the caller passes only once nobody reads the payloads it holds."""
    n = g.shape[0]
    segments = -(-n // seg_len)
    state = scratch.zeroed((segments * STATE,), np.int64, "topk-segment-states")  # (TICKETs left at 0)
    epoch = scratch.epoch()
    stream = device.stream()
    _compensate_states[blocks(n), THREADS, stream](g, e, np.float64(lam), seg_len, e_out, state, epoch)
    payload = _select(e_out, k, state, True, epoch, (seg_len, k_last, _grown))
    host = scratch.Reusing(reuse)
    words = host(scratch.Layout(((np.uint32, payload.shape[0]),), 1))[:4 * payload.shape[0]].view(np.uint32)
    payload.copy_to_host(words, stream=stream)
    stream.synchronize()
    selected: list = []
    for s in range(segments):
        kept, base = (k_last if s == segments - 1 else k), s * (2 * k + 1)
        pairs = (words[base:base + kept], words[base + kept:base + 2 * kept].view(np.float32))
        selected.append(None if words[base + 2 * kept] == epoch else pairs)
    return selected, host.array
