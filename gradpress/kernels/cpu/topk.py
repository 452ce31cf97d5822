"""CPU kernels of top-k, with the rule of ``kernels.selection`` (exact, ties to the lowest
index), in one pass over the input:

1. a threshold ``t`` estimated from a strided sample (``selection.sample_plan``), a little
   below the k-th largest key so that about 1.25k elements reach it;
2. one pass keeps the indices of every key >= t (the candidates) and checks finiteness;
   with error feedback the same pass computes p = g + lambda * e and writes it as the
   new residual, each candidate zeroed while its block is in cache;
3. the exact threshold among the candidates (two small histograms), then the k pairs;
   the candidates not kept (about 1 in 4) get their p back. Zeroing the k chosen entries
   afterwards instead, a cache miss each, took 2 ms more at 16M elements (20.3 against
   18.0 ms in all).

Every key >= the true k-th largest key is a candidate when at least k are, so step 3 sees
all elements the rule could keep, in index order: the result equals the full selection's.
When the estimate was off (fewer than k candidates, or more than the buffer holds) the
stored candidates get their p back and the full selection runs over the whole array
instead (``select_topk``).
"""
import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from gradpress.kernels.cpu.elementwise import compensate
from gradpress.kernels.selection import (
    HIGH_BINS, LOW_BINS, bin_holding_rank, sample_plan, threshold_from_histograms)

_ABS = np.uint32(0x7FFFFFFF)
_INF = np.uint32(0x7F800000)
_ONE = np.uint64(1)
BLOCK = 65536  # elements per block of the candidate pass (64k: 256 KiB of p, in L2)


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


@njit(inline="always", nogil=True, cache=True)
def _p(g: np.ndarray, e: np.ndarray, lam: float, i: int) -> np.float32:
    """p_i = g_i + lam * e_i as ``elementwise.compensate`` rounds it."""
    if lam == 1.0:
        return g[i] + e[i]
    return np.float32(g[i] + lam * e[i])


@njit(inline="always", nogil=True, cache=True)
def _read_out(words: np.ndarray, first: int, bits: np.ndarray, count: int,
              candidates: np.ndarray, keys: np.ndarray, zero: bool) -> int:
    """Append the index and p bits of every set bit of ``words`` (element ``first`` is bit 0
    of word 0) while they are in cache; returns the new count (past the capacity: counted
    only)."""
    capacity = candidates.shape[0]
    for w in range(words.shape[0]):
        word = words[w]
        while word:
            if count < capacity:
                i = first + 64 * w + np.int64(trailing_zeros(word))
                candidates[count] = i
                keys[count] = bits[i]  # the sign too: step 3 takes the value from here
                if zero:
                    bits[i] = 0
            count += 1
            word &= word - _ONE  # clear the lowest set bit
    return count


@njit(inline="always", nogil=True, cache=True)
def _mark_words(g: np.ndarray, e: np.ndarray, lam: float, write: bool, e_out: np.ndarray,
                estimate: np.uint32, words: np.ndarray) -> np.uint32:
    """For the first 64 * len(words) elements: p = g + lam * e into ``e_out`` when
    ``write`` (else p = g), bit j of ``words[w]`` = key 64w + j >= estimate; returns the
    largest key. The fixed-trip loop that writes p and builds the word is what LLVM
    vectorises; the callers pass slices starting at the block so the loop starts at 0
    (the same loop over ``range(first, last)`` of the whole arrays ran scalar, 4x
    slower)."""
    largest = np.uint32(0)
    bits = g.view(np.uint32)
    for w in range(words.shape[0]):
        base = 64 * w
        word = np.uint64(0)
        if write:
            for j in range(64):
                p = _p(g, e, lam, base + j)
                e_out[base + j] = p
                key = np.float32(p).view(np.uint32) & _ABS
                largest = max(largest, key)
                word |= np.uint64(key >= estimate) << np.uint64(j)
        else:
            for j in range(64):
                key = bits[base + j] & _ABS
                largest = max(largest, key)
                word |= np.uint64(key >= estimate) << np.uint64(j)
        words[w] = word
    return largest


@njit(nogil=True, cache=True)
def _scan(g: np.ndarray, e: np.ndarray, lam: float, write: bool, e_out: np.ndarray,
          estimate: np.uint32, candidates: np.ndarray, keys: np.ndarray) -> tuple:
    """The one pass: p = g + lam * e (into ``e_out`` when ``write``; it must not alias g
    or e), the index and bits of every candidate (at most ``len(candidates)`` stored), and
    whether every p is finite. Returns (candidate count, all finite).

    Block by block (in cache): ``_mark_words`` (p, the words of keys >= estimate, the
    largest key, in one vectorised loop), then the block's set bits are read out. A branch
    or an append per element does not vectorise; p, marks and check as three loops per
    block measured 14.5 ms at 16M elements, this 9.8."""
    n = g.shape[0]
    bits = (e_out if write else g).view(np.uint32)
    words = np.zeros(BLOCK // 64, np.uint64)
    largest = np.uint32(0)
    count = 0
    for start in range(0, n - n % 64, BLOCK):
        end = min(start + BLOCK, n - n % 64)
        block_words = words[:(end - start) // 64]
        largest = max(largest, _mark_words(g[start:end], e[start:end], lam, write,
                                           e_out[start:end], estimate, block_words))
        count = _read_out(block_words, start, bits, count, candidates, keys, write)
    start = n - n % 64
    if start < n:  # the last n % 64 elements
        if write:
            compensate(g[start:], e[start:], lam, e_out[start:])
        word = np.uint64(0)
        for j in range(n - start):
            key = bits[start + j] & _ABS
            largest = max(largest, key)
            word |= np.uint64(key >= estimate) << np.uint64(j)
        words[0] = word
        count = _read_out(words[:1], start, bits, count, candidates, keys, write)
    return count, largest < _INF


@njit(nogil=True, cache=True)
def _take(p: np.ndarray, candidates: np.ndarray, keys: np.ndarray, indices: np.ndarray,
          values: np.ndarray, restore: bool) -> None:
    """Exactly k of the candidates by the selection rule; with ``restore`` the scan
    zeroed every candidate's p, and those not kept get their p back."""
    k = indices.shape[0]
    threshold, keep_equal = _threshold(keys, k)
    found = keys.view(np.float32)  # p itself: no read of p[i] (a cache miss each)
    out = 0
    for j in range(candidates.shape[0]):
        key = keys[j] & _ABS
        equal = key == threshold
        keep = out < k and ((key > threshold) | (equal & (keep_equal > 0)))
        if keep:
            indices[out] = candidates[j]
            values[out] = found[j]
            keep_equal -= np.int64(equal)
            out += 1
        elif restore:
            p[candidates[j]] = found[j]


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
    if write:  # the scan zeroed what it stored
        found = keys.view(np.float32)
        for j in range(min(count, capacity)):
            p[candidates[j]] = found[j]
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
