"""The pipeline schedules the runner knows, without torch: names, stage placement and how many
stages each puts on a rank.

``parallel.pipeline`` maps each name to its ``torch.distributed.pipelining`` class; everything
that only validates or plans a layout reads this table instead, so it never imports torch.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ScheduleSpec:
    placement: str             # "loop" (stage s on rank s mod p) or "v" (rank r: r and 2p−1−r)
    fixed_virtual: int | None  # stages per rank the schedule requires; None: any (multi-stage)
    multi: bool                # several stages per rank


SCHEDULES: dict[str, ScheduleSpec] = {
    "gpipe": ScheduleSpec("loop", 1, False),
    "1f1b": ScheduleSpec("loop", 1, False),
    "interleaved-1f1b": ScheduleSpec("loop", None, True),
    "looped-bfs": ScheduleSpec("loop", None, True),
    "zero-bubble": ScheduleSpec("loop", None, True),
    "zbv": ScheduleSpec("v", 2, True),
    "dualpipev": ScheduleSpec("v", 2, True),
}


def stages_of_rank(rank: int, p: int, v: int, placement: str) -> list[int]:
    """Global stage indices held by pipeline rank ``rank``, in chunk order."""
    if placement == "v":
        return [rank, 2 * p - 1 - rank]
    return [rank + i * p for i in range(v)]
