"""The pipeline schedules meshscope knows, and their closed forms.

``SCHEDULES`` names each schedule with how it places stages on ranks: ``"loop"`` puts global
stage s on pipeline rank s mod p (GPipe, 1F1B, and with v > 1 stages per rank interleaved 1F1B,
looped BFS, ZB1P); ``"v"`` puts stages r and 2p−1−r on rank r (ZB-V, DualPipeV), so a
microbatch goes down the ranks and back up. ``parallel.pipeline`` maps each name to its
``torch.distributed.pipelining`` class; everything that only validates, plans or analyses reads
this table, so it never imports torch.

**The bubble** (``bubble_fraction``). With p pipeline ranks, m microbatches and v stages per
rank, when every forward and backward takes the same time (Narayanan et al., 2021, §2.2):

- GPipe (Huang et al., 2019) and 1F1B (PipeDream-Flush): the bubble is (p−1)/m of the ideal
  time, i.e. (p−1)/(m+p−1) of the step — the first stage waits p−1 forward slots for the last
  to start, and the last waits p−1 backward slots at the end;
- interleaved 1F1B (Narayanan et al., 2021, §2.2.2) and looped BFS (Lamy-Poirier, 2023) loop
  each microbatch v times round the ranks, so each slot is v times shorter:
  (p−1)/(v·m+p−1);
- the zero-bubble schedules (ZB1P, ZB-V; Qi et al., 2024) and DualPipeV (DeepSeek-V3 report,
  2024) fill the bubble with the deferred weight-gradient work: 0 when forward, input-gradient
  and weight-gradient times are balanced (on a real machine they are not, exactly).

**Activations in flight** (``in_flight``): how many microbatches' activations a pipeline rank
holds at its peak, the factor a stage's activation memory is multiplied by: all m for GPipe and
looped BFS (every forward before any backward), p − r for 1F1B on rank r (its warm-up forwards
plus one), and torch's own warm-up count for the interleaved schedules
(``torch.distributed.pipelining.schedules``: (v−1)·p + 2·(p−1−r) + 1 chunk-microbatches).
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

# Schedules by the closed form of their bubble (the module docstring).
FILL_THEN_DRAIN = ("gpipe", "1f1b")
INTERLEAVED = ("interleaved-1f1b", "looped-bfs")
ZERO_BUBBLE = ("zero-bubble", "zbv", "dualpipev")


def stages_of_rank(rank: int, p: int, v: int, placement: str) -> list[int]:
    """Global stage indices held by pipeline rank ``rank``, in chunk order: ``rank + i·p``
    for i < v with the loop placement, ``[rank, 2p−1−rank]`` with the V placement."""
    if placement == "v":
        return [rank, 2 * p - 1 - rank]
    return [rank + i * p for i in range(v)]


def bubble_fraction(schedule: str | None, p: int, m: int, v: int = 1) -> float:
    """The schedule's bubble as a fraction of the pipeline's step time (0 without a pipeline,
    p ≤ 1); ``ValueError`` for a schedule not in ``SCHEDULES``."""
    if p <= 1:
        return 0.0
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    if schedule in FILL_THEN_DRAIN:
        return (p - 1) / (m + p - 1)
    if schedule in INTERLEAVED:
        return (p - 1) / (v * m + p - 1)
    return 0.0  # zero-bubble, zbv, dualpipev: the ideal


def in_flight(schedule: str | None, p: int, m: int, v: int, rank: int) -> float:
    """Activations held at the peak on pipeline rank ``rank``, in units of one microbatch
    through *all* of that rank's layers (so a chunk-microbatch counts 1/v)."""
    if p <= 1:
        return 1.0
    if schedule in ("gpipe", "looped-bfs"):
        return float(m)
    if schedule == "1f1b":
        return float(min(m, p - rank))
    if SCHEDULES[schedule].placement == "v":
        # ZB-V / DualPipeV: rank r's two chunks warm up like a 1F1B of 2p stages.
        return min(m * v, 2 * (p - rank)) / v
    warmup = (v - 1) * p + 2 * (p - 1 - rank)
    return min(m * v, warmup + 1) / v
