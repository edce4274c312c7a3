"""Every rank's value of a mapping rank → value, in rank order, one at a time.

The cross-rank stage's timelines are a mapping that reads each rank's from disk on access
(``report/spill.Timelines``; a 216k-event GPU rank's aligned timeline is ~1.6 MB).
``sorted(timelines.items())`` reads every rank's before the first is used and holds them all
while the loop runs — the step tables and each step's dependency graph held every rank's
timeline at once, ~1.6 MB a rank of that trace (issue 51). ``in_rank_order`` sorts the ranks
alone and reads each value when the loop reaches it; the order and the pairs are the same.
"""
from __future__ import annotations

from typing import Iterator, Mapping, TypeVar

V = TypeVar("V")


def in_rank_order(by_rank: Mapping[int, V]) -> Iterator[tuple[int, V]]:
    """(rank, value) of ``by_rank`` by ascending rank, each value looked up as it is reached."""
    for rank in sorted(by_rank):
        yield rank, by_rank[rank]
