"""Rank lists in words: runs of consecutive ranks written as ranges, so that a message or a
table cell naming the ranks of a 1,024-rank job stays short."""
from __future__ import annotations

from typing import Iterable


def ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` → ``0–2, 5, 7–8``."""
    out: list[list[int]] = []
    for r in sorted(set(ranks)):
        if out and out[-1][1] == r - 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in out)
