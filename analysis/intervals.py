"""Interval arithmetic on sorted, disjoint interval sets.

An interval set is a float64 array of shape (n, 2) — rows ``[start, end)`` in µs — sorted by start
with no two rows overlapping or touching. ``union`` builds one from any intervals; the other
functions take and return such sets. All metrics of the overlap and bubble reports are lengths
of sets built here, so "compute", "communication" and their overlap are one definition each.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

EMPTY = np.zeros((0, 2), dtype=np.float64)


def union(starts, ends) -> np.ndarray:
    """Merge arbitrary intervals into a sorted, disjoint set (empty intervals are dropped)."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    keep = e > s
    if not keep.all():
        s, e = s[keep], e[keep]
    del keep
    if s.size == 0:
        return EMPTY.copy()
    # Already in order (the sets innermost and the interval operations make): no sort, which
    # would copy both columns (a stable sort of sorted starts is the identity).
    if not (s[1:] >= s[:-1]).all():
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
        del order
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
    if len(a) > 4 * len(b):
        # Only the rows of a that end after b begins and begin before b ends can meet it:
        # found by bisection, so a large set met with a few windows is not swept whole.
        a = a[np.searchsorted(a[:, 1], b[0, 0], side="right"):
              np.searchsorted(a[:, 0], b[-1, 1], side="left")]
        if not len(a):
            return EMPTY.copy()
    # Candidate pairs: for each row of a, the rows of b that can overlap it.
    lo = np.searchsorted(b[:, 1], a[:, 0], side="right")
    hi = np.searchsorted(b[:, 0], a[:, 1], side="left")
    counts = np.maximum(hi - lo, 0)
    if counts.sum() == 0:
        return EMPTY.copy()
    ai, bi = pairs(lo, counts)
    s = np.maximum(a[ai, 0], b[bi, 0])
    e = np.minimum(a[ai, 1], b[bi, 1])
    keep = e > s
    return np.column_stack([s[keep], e[keep]])


def pairs(lo: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every pair (i, lo[i] + k) for 0 ≤ k < counts[i] (counts ≥ 0), ordered by i then k, as
    two arrays: each row of one array beside the run of another's rows that it meets."""
    i = np.repeat(np.arange(len(counts)), counts)
    offsets = np.arange(i.size) - np.repeat(np.cumsum(counts) - counts, counts)
    return i, np.repeat(lo, counts) + offsets


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


# Ranges ``innermost`` reads at once, where the ranges allow a cut (``_cuts``).
INNERMOST_BLOCK = 1 << 16


def innermost(starts, ends, labels, block: int = INNERMOST_BLOCK) -> dict:
    """Split time among nested ranges by the innermost one: at each instant the covering range
    that started last owns it (of ranges that start together, the later one given). Returns
    label → interval set of the time its ranges own.

    This is "self time" for profiler ranges, and it stays meaningful when a range is not
    properly nested (an asynchronous ``gloo:send`` that stays open while later ops run: those
    ops, having started later, own their time; the send owns only the gaps).

    How, without a loop over events: number the ranges by start (ties in input order). Between
    two consecutive boundaries ``t`` (starts and ends) the ranges begun by ``t`` are a prefix
    ``[0, P)`` of that numbering, and the owner is the highest-numbered one in it still open,
    the last ``j < P`` with ``end[j] > t``. A table of the maximum end over every block of
    2^k ranges answers that for all segments at once: from ``P`` leftwards, skip each block,
    largest first, whose ends are all ``≤ t`` (O(n log n) in numpy).

    That table holds n log n floats, so the ranges are taken ``block`` at a time where they
    allow it (``_cuts``: where no earlier range is still open, nothing before can own time
    after), and each label's sets of the pieces are joined: the same sets, since no piece's
    segment meets another's but at an end.
    """
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    if not isinstance(labels, (pd.Series, pd.Index, np.ndarray)):
        labels = np.asarray(list(labels), dtype=object)
    codes, names = pd.factorize(labels)
    if s.size == 0:
        return {}
    order = np.argsort(s, kind="stable")
    s, e, codes = s[order], e[order], codes[order]
    cuts = _cuts(s, e, block)
    if len(cuts) == 2:
        return _innermost_sorted(s, e, codes, names)
    parts: dict = {lab: [] for lab in names}
    for a, b in zip(cuts[:-1], cuts[1:]):
        for lab, x in _innermost_sorted(s[a:b], e[a:b], codes[a:b], names).items():
            parts[lab].append(x)
    return {lab: merge(*xs) for lab, xs in parts.items()}


def _cuts(s: np.ndarray, e: np.ndarray, block: int) -> list[int]:
    """Positions ``0 = c0 < c1 < … < n`` of ranges sorted by start at which no earlier range is
    still open (its end at most the next start), at least ``block`` ranges apart where the
    ranges allow it."""
    n = s.size
    if n <= block:
        return [0, n]
    allowed = np.flatnonzero(s[1:] >= np.maximum.accumulate(e)[:-1]) + 1
    cuts = [0]
    while True:
        j = int(np.searchsorted(allowed, cuts[-1] + block))
        if j == allowed.size:
            break
        cuts.append(int(allowed[j]))
    return cuts + [n]


def _innermost_sorted(s: np.ndarray, e: np.ndarray, codes: np.ndarray, names) -> dict:
    """``innermost`` of ranges already sorted by start (``codes`` into ``names``)."""
    bounds = np.unique(np.concatenate([s, e]))
    t = bounds[:-1]
    pos = np.searchsorted(s, t, side="right")  # P: the ranges begun by t
    # block_max[k][i] = max(e[i : i + 2**k]) for every i with a whole block.
    block_max = [e]
    while (1 << len(block_max)) <= e.size:
        prev, half = block_max[-1], 1 << (len(block_max) - 1)
        block_max.append(np.maximum(prev[:-half], prev[half:]))
    for k in range(len(block_max) - 1, -1, -1):
        width = 1 << k
        lo = pos - width
        can = lo >= 0
        idx = np.where(can, lo, 0)
        skip = can & (block_max[k][idx] <= t)
        pos = np.where(skip, lo, pos)
    owner = pos - 1  # -1: no range covers the segment
    covered = owner >= 0
    seg = np.column_stack([t, bounds[1:]])[covered]
    who = codes[owner[covered]]
    return {lab: of(seg[who == c]) for c, lab in enumerate(names)}
