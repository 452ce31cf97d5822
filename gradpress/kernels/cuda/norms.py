"""Norm lanes on the GPU: thread (chunk c, lane j) adds the lane of
``kernels.reduction``; the host finishes with the same trees as the CPU kernel."""
import numpy as np
from numba import cuda

from gradpress.kernels.cuda.device import THREADS, blocks
from gradpress.kernels.reduction import CHUNK, LANES, chunk_count, finish_lane_sums

_FLOAT32_MAX = np.float32(3.4028235e38)


@cuda.jit
def _lane_sums(x, square, lane_sums):
    t = cuda.grid(1)
    if t >= lane_sums.shape[0]:
        return
    start = (t // LANES) * CHUNK + t % LANES
    total = 0.0
    for m in range(CHUNK // LANES):
        i = start + m * LANES
        if i < x.shape[0]:
            v = np.float64(x[i])
            total += v * v if square else abs(v)
    lane_sums[t] = total


@cuda.jit
def _lane_max_bits(x_bits, lane_max):
    t = cuda.grid(1)
    if t >= lane_max.shape[0]:
        return
    start = (t // LANES) * CHUNK + t % LANES
    best = np.uint32(0)
    for m in range(CHUNK // LANES):
        i = start + m * LANES
        if i < x_bits.shape[0]:
            best = max(best, x_bits[i] & np.uint32(0x7FFFFFFF))
    lane_max[t] = best


def _ordered_sum(x, square: bool) -> float:
    lanes = cuda.device_array(chunk_count(x.shape[0]) * LANES, np.float64)
    _lane_sums[blocks(lanes.shape[0]), THREADS](x, square, lanes)
    return finish_lane_sums(lanes.copy_to_host())


def abs_sum(x) -> float:
    return _ordered_sum(x, False)


def square_sum(x) -> float:
    return _ordered_sum(x, True)


def max_abs_bits(x) -> int:
    lanes = cuda.device_array(chunk_count(x.shape[0]) * LANES, np.uint32)
    _lane_max_bits[blocks(lanes.shape[0]), THREADS](x.view(np.uint32), lanes)
    return int(lanes.copy_to_host().max())


@cuda.jit
def _feedback_lane_sums(g, e, lam, square, lane_sums):
    """``_lane_sums`` of p = g + lam * e, p computed on the fly."""
    t = cuda.grid(1)
    if t >= lane_sums.shape[0]:
        return
    start = (t // LANES) * CHUNK + t % LANES
    total = 0.0
    for m in range(CHUNK // LANES):
        i = start + m * LANES
        if i < g.shape[0]:
            v = np.float64(g[i] + lam * e[i])
            total += v * v if square else abs(v)
    lane_sums[t] = total


@cuda.jit
def _feedback_lane_max(g, e, lam, lane_max):
    """Largest |p| per lane as float32 (inf for a NaN/inf): float32 maxima order as
    their bits do, and no bit cast of a register is needed."""
    t = cuda.grid(1)
    if t >= lane_max.shape[0]:
        return
    start = (t // LANES) * CHUNK + t % LANES
    best = np.float32(0.0)
    for m in range(CHUNK // LANES):
        i = start + m * LANES
        if i < g.shape[0]:
            magnitude = abs(g[i] + lam * e[i])
            if not magnitude <= _FLOAT32_MAX:
                magnitude = np.float32(np.inf)
            best = max(best, magnitude)
    lane_max[t] = best


def feedback_sum(g, e, lam: float, square: bool) -> float:
    """``abs_sum`` / ``square_sum`` of p = g + lam * e without storing p."""
    lanes = cuda.device_array(chunk_count(g.shape[0]) * LANES, np.float64)
    _feedback_lane_sums[blocks(lanes.shape[0]), THREADS](g, e, np.float32(lam), square, lanes)
    return finish_lane_sums(lanes.copy_to_host())


def feedback_max_abs_bits(g, e, lam: float) -> int:
    """``max_abs_bits`` of p = g + lam * e without storing p."""
    lanes = cuda.device_array(chunk_count(g.shape[0]) * LANES, np.float32)
    _feedback_lane_max[blocks(lanes.shape[0]), THREADS](g, e, np.float32(lam), lanes)
    return int(np.float32(lanes.copy_to_host().max()).view(np.uint32))
