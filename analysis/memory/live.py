"""The allocations live at a moment, and what made them.

Each allocation (``Bytes`` > 0) of a device is paired with the next free (``Bytes`` < 0) of
the same address on that device (``pairs``): a block is live from its allocation until that
free, or to the end of the trace when it is never freed. At the moment of event ``p`` of a
``Series`` (its peak, say), the live blocks are the allocations at or before ``p`` whose free
comes after ``p`` (``live_at``). A free whose allocation the trace does not hold (made before
the profiler started) frees a block the trace never saw allocated: at an ``absolute`` total
(the caching allocator's own counter) what was live but allocated before the trace began is
the total at ``p`` less the live blocks the trace saw — the row ``(before the trace)``.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from meshscope.analysis.memory.series import Series

BEFORE_TRACE = "(before the trace)"


def pairs(s: Series) -> np.ndarray:
    """For each event of ``s``, the index of the free that ends its block (allocations only;
    -1 for a block never freed in the trace, and for every free). Events of one address
    alternate allocation, free in a well-formed trace; a second allocation of an address with
    no free between is taken as a free the trace missed."""
    n = len(s)
    out = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return out
    known = s.addr != 0
    idx = np.flatnonzero(known)
    order = idx[np.lexsort((idx, s.addr[idx]))]        # by address, then time order
    a = s.addr[order]
    b = s.bytes[order]
    nxt_same = np.zeros(len(order), dtype=bool)
    nxt_same[:-1] = a[:-1] == a[1:]
    is_alloc = b > 0
    freed_next = np.zeros(len(order), dtype=bool)
    freed_next[:-1] = nxt_same[:-1] & (b[1:] < 0)
    sel = is_alloc & freed_next
    out[order[sel]] = order[np.flatnonzero(sel) + 1]
    # An allocation followed by another allocation of its address: its free was missed; it is
    # not live past the next allocation.
    again = is_alloc & nxt_same & ~freed_next
    again[:-1] &= b[1:] > 0
    out[order[again]] = order[np.flatnonzero(again) + 1]
    return out


@dataclasses.dataclass(frozen=True)
class Live:
    """The blocks live at one moment: their event indices, and the bytes live at that moment
    that the trace never saw allocated (``before_bytes``; 0 unless the totals are
    ``absolute``)."""
    at: int
    index: np.ndarray
    before_bytes: int


def live_at(s: Series, p: int, freed_by: np.ndarray | None = None) -> Live:
    """The blocks of ``s`` live at event ``p`` (module docstring)."""
    if freed_by is None:
        freed_by = pairs(s)
    upto = np.arange(p + 1)
    alloc = s.bytes[:p + 1] > 0
    end = freed_by[:p + 1]
    alive = alloc & ((end < 0) | (end > p))
    index = upto[alive]
    before = 0
    if s.totals == "absolute":
        before = max(int(s.allocated[p]) - int(s.bytes[index].sum()), 0)
    return Live(at=p, index=index, before_bytes=before)
