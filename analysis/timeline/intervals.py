"""Interval arithmetic on sorted, disjoint interval sets.

An interval set is a float64 array of shape (n, 2) — rows ``[start, end)`` in µs — sorted by start
with no two rows overlapping or touching. ``union`` builds one from any intervals; the other
functions take and return such sets. All metrics of the overlap and bubble reports are lengths
of sets built here, so "compute", "communication" and their overlap are one definition each.
"""
from __future__ import annotations

import numpy as np

EMPTY = np.zeros((0, 2), dtype=np.float64)


def union(starts, ends) -> np.ndarray:
    """Merge arbitrary intervals into a sorted, disjoint set (empty intervals are dropped)."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return EMPTY.copy()
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    # A new merged interval begins where the start exceeds every end seen so far.
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    out_end = np.maximum.reduceat(e, idx)
    return np.column_stack([s[idx], out_end])


def of(ivs: np.ndarray) -> np.ndarray:
    """Normalise an (n, 2) array of possibly overlapping intervals."""
    ivs = np.asarray(ivs, dtype=np.float64).reshape(-1, 2)
    return union(ivs[:, 0], ivs[:, 1])


def merge(*sets: np.ndarray) -> np.ndarray:
    """Union of several interval sets."""
    stacked = np.concatenate([np.asarray(x).reshape(-1, 2) for x in sets]) if sets else EMPTY
    return of(stacked)


def length(a: np.ndarray) -> float:
    return float((a[:, 1] - a[:, 0]).sum()) if len(a) else 0.0


def intersect(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a ∩ b for two disjoint sorted sets (two-pointer sweep, O(len(a) + len(b)))."""
    if not len(a) or not len(b):
        return EMPTY.copy()
    # Candidate pairs: for each row of a, the rows of b that can overlap it.
    lo = np.searchsorted(b[:, 1], a[:, 0], side="right")
    hi = np.searchsorted(b[:, 0], a[:, 1], side="left")
    counts = np.maximum(hi - lo, 0)
    if counts.sum() == 0:
        return EMPTY.copy()
    ai = np.repeat(np.arange(len(a)), counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    bi = np.repeat(lo, counts) + offsets
    s = np.maximum(a[ai, 0], b[bi, 0])
    e = np.minimum(a[ai, 1], b[bi, 1])
    keep = e > s
    return np.column_stack([s[keep], e[keep]])


def subtract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a \\ b for two disjoint sorted sets."""
    if not len(a) or not len(b):
        return a.copy()
    lo, hi = a[:, 0].min(), a[:, 1].max()
    # Complement of b within [lo, hi], then intersect.
    edges = np.concatenate([[lo], b.ravel(), [hi]])
    gaps = edges.reshape(-1, 2)
    gaps = gaps[gaps[:, 1] > gaps[:, 0]]
    return intersect(a, of(gaps))


def clip(a: np.ndarray, start: float, end: float) -> np.ndarray:
    """a ∩ [start, end)."""
    return intersect(a, np.array([[start, end]], dtype=np.float64))


def innermost(starts, ends, labels) -> dict:
    """Split time among nested ranges by the innermost one: at each instant the covering range
    that started last owns it. Returns label → interval set of the time its ranges own.

    This is "self time" for profiler ranges, and it stays meaningful when a range is not
    properly nested (an asynchronous ``gloo:send`` that stays open while later ops run: those
    ops, having started later, own their time; the send owns only the gaps).
    """
    import heapq

    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    labels = list(labels)
    order = np.argsort(s, kind="stable")
    bounds = np.unique(np.concatenate([s, e]))
    owned: dict = {lab: [] for lab in set(labels)}
    heap: list = []  # (-start, -index, end, label): the latest-started open range on top
    k = 0
    for i in range(len(bounds) - 1):
        t0, t1 = bounds[i], bounds[i + 1]
        while k < len(order) and s[order[k]] <= t0:
            j = order[k]
            heapq.heappush(heap, (-s[j], -k, e[j], labels[j]))
            k += 1
        while heap and heap[0][2] <= t0:
            heapq.heappop(heap)
        if heap:
            # Lazily drop closed ranges below the top as they surface.
            owned[heap[0][3]].append((t0, t1))
    return {lab: of(np.array(v, dtype=np.float64)) if v else EMPTY.copy()
            for lab, v in owned.items()}
