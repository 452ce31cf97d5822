"""CPU kernels of top-k, with the rule of ``kernels.selection`` (exact, ties to the lowest
index), in one pass over the input:

1. a threshold ``t`` estimated from a strided sample (``selection.sample_plan``), a little
   below the k-th largest key so that about 1.25k elements reach it;
2. one pass keeps the indices of every key >= t (the candidates) and checks finiteness;
   with error feedback the same pass computes p = g + lambda * e and writes it as the
   new residual;
3. the exact threshold among the candidates (two small histograms), then the k pairs.

Every key >= the true k-th largest key is a candidate when at least k are, so step 3 sees
all elements the rule could keep, in index order: the result equals the full selection's.
When the estimate was off (fewer than k candidates, or more than the buffer holds) the
full selection runs over the whole array instead (``select_topk``).
"""
import numpy as np
from numba import njit

from gradpress.kernels.cpu.elementwise import compensate
from gradpress.kernels.cpu.randomk import bit_position
from gradpress.kernels.selection import (
    HIGH_BINS, LOW_BINS, bin_holding_rank, sample_plan, threshold_from_histograms)

_ABS = np.uint32(0x7FFFFFFF)
_INF = np.uint32(0x7F800000)
_ONE = np.uint64(1)
BLOCK = 4096  # elements per block of the candidate pass (a multiple of 64)


@njit(nogil=True, cache=True)
def _threshold(keys: np.ndarray, k: int) -> tuple:
    high = np.zeros(HIGH_BINS, np.int64)
    for i in range(keys.shape[0]):
        high[(keys[i] & _ABS) >> 16] += 1
    high_bin, above_high = bin_holding_rank(high, k)
    low = np.zeros(LOW_BINS, np.int64)
    for i in range(keys.shape[0]):
        key = keys[i] & _ABS
        if key >> 16 == high_bin:
            low[key & 0xFFFF] += 1
    return threshold_from_histograms(high_bin, above_high, low, k)


@njit(nogil=True, cache=True)
def select_topk(x: np.ndarray, indices: np.ndarray, values: np.ndarray) -> None:
    """Full selection: the k (= len(indices) >= 1) largest magnitudes of finite ``x``."""
    keys = x.view(np.uint32)
    threshold, keep_equal = _threshold(keys, indices.shape[0])
    out = 0
    for i in range(keys.shape[0]):
        key = keys[i] & _ABS
        if key > threshold or (key == threshold and keep_equal > 0):
            if key == threshold:
                keep_equal -= 1
            indices[out] = i
            values[out] = x[i]
            out += 1


@njit(nogil=True, cache=True)
def _estimate(g: np.ndarray, e: np.ndarray, lam: float, k: int) -> tuple:
    """(estimated threshold key, candidate capacity) from the strided sample of p."""
    n = g.shape[0]
    m, rank, capacity = sample_plan(n, k)
    sample = np.empty(m, np.uint32)
    for j in range(m):
        i = (j * n) // m
        sample[j] = np.float32(g[i] + lam * e[i]).view(np.uint32) & _ABS
    sample.sort()
    return sample[m - rank], capacity


@njit(nogil=True, cache=True)
def _mark(bits: np.ndarray, estimate: np.uint32, marks: np.ndarray) -> np.uint32:
    """Bit i of ``marks`` = key i >= estimate (the bit layout of ``kernels.bitlayout``);
    returns the largest key. Branch-free, so LLVM vectorises it."""
    n = bits.shape[0]
    largest = np.uint32(0)
    for b in range(n // 8):
        byte = np.uint8(0)
        for j in range(8):  # a fixed trip count: this is what vectorises
            key = bits[8 * b + j] & _ABS
            largest = max(largest, key)
            byte |= np.uint8(key >= estimate) << np.uint8(j)
        marks[b] = byte
    if n % 8:
        byte = np.uint8(0)
        for i in range(n - n % 8, n):
            key = bits[i] & _ABS
            largest = max(largest, key)
            byte |= np.uint8(key >= estimate) << np.uint8(i % 8)
        marks[n // 8] = byte
    return largest


@njit(nogil=True, cache=True)
def _scan(g: np.ndarray, e: np.ndarray, lam: float, write: bool, e_out: np.ndarray,
          estimate: np.uint32, candidates: np.ndarray, keys: np.ndarray) -> tuple:
    """The one pass: p = g + lam * e (into ``e_out`` when ``write``), the index and key of
    every candidate (at most ``len(candidates)`` stored), and whether every p is finite.
    Returns (candidate count, all finite).

    Block by block: p, then a bitmap of keys >= estimate, whose set bits are read out
    while the block is in cache. Separate simple loops vectorise; one loop doing it all
    (or appending candidates as it goes) measured 2-3x slower."""
    n = g.shape[0]
    marks = np.zeros(BLOCK // 8, np.uint8)
    words = marks.view(np.uint64)
    bits = (e_out if write else g).view(np.uint32)
    largest = np.uint32(0)
    count = 0
    capacity = candidates.shape[0]
    for start in range(0, n, BLOCK):
        end = min(start + BLOCK, n)
        if write:
            compensate(g[start:end], e[start:end], lam, e_out[start:end])
        marks[:] = 0
        largest = max(largest, _mark(bits[start:end], estimate, marks))
        for w in range((end - start + 63) // 64):
            word = words[w]
            while word:
                low = word & (~word + _ONE)  # lowest set bit
                if count < capacity:
                    i = start + w * 64 + bit_position(low)
                    candidates[count] = i
                    keys[count] = bits[i] & _ABS
                count += 1
                word ^= low
    return count, largest < _INF


@njit(nogil=True, cache=True)
def _take(p: np.ndarray, candidates: np.ndarray, keys: np.ndarray, indices: np.ndarray,
          values: np.ndarray, zero: bool) -> None:
    """Exactly k of the candidates by the selection rule; their p zeroed when ``zero``."""
    threshold, keep_equal = _threshold(keys, indices.shape[0])
    out = 0
    for j in range(candidates.shape[0]):
        key = keys[j]
        if key > threshold or (key == threshold and keep_equal > 0):
            if key == threshold:
                keep_equal -= 1
            i = candidates[j]
            indices[out] = i
            values[out] = p[i]
            if zero:
                p[i] = 0.0
            out += 1


@njit(nogil=True, cache=True)
def _select(g, e, lam, write, e_out, estimate, capacity, indices, values) -> tuple:
    """Steps 2 and 3. Returns (all finite, whether the estimate held)."""
    k = indices.shape[0]
    candidates = np.empty(capacity, np.int64)
    keys = np.empty(capacity, np.uint32)
    count, finite = _scan(g, e, lam, write, e_out, estimate, candidates, keys)
    if not finite:
        return False, True
    p = e_out if write else g
    if k <= count <= capacity:
        _take(p, candidates[:count], keys[:count], indices, values, write)
        return True, True
    select_topk(p, indices, values)
    if write:
        for j in range(k):
            p[indices[j]] = 0.0
    return True, False


@njit(nogil=True, cache=True)
def topk(x: np.ndarray, indices: np.ndarray, values: np.ndarray) -> bool:
    """The k (= len(indices) >= 1) largest magnitudes of ``x``; False (nothing
    meaningful written) when ``x`` has a NaN or inf."""
    estimate, capacity = _estimate(x, x, 0.0, indices.shape[0])
    return _select(x, x, 0.0, False, x, estimate, capacity, indices, values)[0]


@njit(nogil=True, cache=True)
def topk_feedback(g: np.ndarray, e: np.ndarray, lam: float, e_out: np.ndarray,
                  indices: np.ndarray, values: np.ndarray) -> bool:
    """Error feedback fused into top-k: p = g + lam * e; the pairs of top-k(p); e_out = p
    with the chosen entries zeroed (exactly p - D(c)). False when p is not finite;
    ``e_out`` then holds garbage and must not alias ``e`` (``g`` and ``e`` are intact).
    With ``lam = 0`` and ``e = g``, p is g bit for bit (first step of a key)."""
    estimate, capacity = _estimate(g, e, lam, indices.shape[0])
    return _select(g, e, lam, True, e_out, estimate, capacity, indices, values)[0]


@njit(nogil=True, cache=True)
def topk_feedback_with(g, e, lam, e_out, indices, values, estimate, capacity) -> tuple:
    """``topk_feedback`` with a given estimate (tests force the fallback with it).
    Returns (all finite, whether the estimate held)."""
    return _select(g, e, lam, True, e_out, np.uint32(estimate), capacity, indices, values)


@njit(nogil=True, cache=True)
def choose_among(candidates: np.ndarray, candidate_values: np.ndarray, indices: np.ndarray,
                 values: np.ndarray) -> None:
    """Step 3 for candidates given as (index, value) pairs in index order (the GPU path):
    exactly k = len(indices) of them by the selection rule."""
    keys = candidate_values.view(np.uint32) & _ABS
    threshold, keep_equal = _threshold(keys, indices.shape[0])
    out = 0
    for j in range(keys.shape[0]):
        key = keys[j]
        if key > threshold or (key == threshold and keep_equal > 0):
            if key == threshold:
                keep_equal -= 1
            indices[out] = candidates[j]
            values[out] = candidate_values[j]
            out += 1
