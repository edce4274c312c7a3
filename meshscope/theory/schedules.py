"""The pipeline schedules meshscope knows, and their closed forms.

``SCHEDULES`` names each schedule with how it places stages on ranks: ``"loop"`` puts global
stage s on pipeline rank s mod p (GPipe, 1F1B, and with v > 1 stages per rank interleaved 1F1B,
looped BFS, ZB1P); ``"v"`` puts stages r and 2p−1−r on rank r (ZB-V, DualPipeV), so a
microbatch goes down the ranks and back up. ``parallel.pipeline`` maps each name to its
``torch.distributed.pipelining`` class; everything that only validates, plans or analyses reads
this table, so it never imports torch.

**The bubble** (``bubble_fraction``, from ``idle_microbatches``). With p pipeline ranks, m
microbatches and v stages per rank, when every forward and backward takes the same time
(Narayanan et al., 2021, §2.2), a rank is idle for ``idle_microbatches`` times one microbatch's
compute on it (forward and backward through all its layers) while it computes m of them; the
bubble is that idle time over the step, idle/(m + idle):

- GPipe (Huang et al., 2019) and 1F1B (PipeDream-Flush): p−1 microbatches, a bubble of
  (p−1)/(m+p−1) — the first stage waits p−1 forward slots for the last to start, and the last
  waits p−1 backward slots at the end;
- interleaved 1F1B (Narayanan et al., 2021, §2.2.2) and looped BFS (Lamy-Poirier, 2023) loop
  each microbatch v times round the ranks, so each slot is v times shorter: (p−1)/v, a bubble
  of (p−1)/(v·m+p−1);
- the zero-bubble schedules (ZB1P, ZB-V; Qi et al., 2024) and DualPipeV (DeepSeek-V3 report,
  2024) split the backward into its input gradient (I) and its weight gradient (W) and move
  the W to fill the drain; with a chunk's F, I and W equal (a microbatch on a rank is 3·v
  chunk slots), torch's own action orders (``torch.distributed.pipelining``, replayed in
  ``tests/test_schedules_against_torch.py``) leave p−1 chunk-forward slots idle — (p−1)/(3v)
  microbatches, a bubble of (p−1)/(3·v·m+p−1), ZB-H1's figure in Qi et al. 2024 (a third of
  interleaving's). That holds for ZB1P from m = p, for DualPipeV (which needs m ≥ 2p), and for
  ZB-V from m = ⌈(3p−1)/2⌉. Below that, ZB-V's order leaves 4p−2m−2 chunk slots (its warm-up
  does not fill: p = 4, m = 4 leaves 6, not 3), which the function gives; ZB1P with m < p
  leaves more than p−1 (torch's warm-up for fewer microbatches than ranks, a count that
  depends on v), where the function's p−1 is a lower bound. When F, I and W are not equal the
  idle time is (p−1)·(F + I − W) chunk time (Qi et al., §3), which the planner's calibrated
  excess (``layouts/plan/calibrate.py``) and the analysis' measured bubble stand for.

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


def idle_microbatches(schedule: str | None, p: int, m: int, v: int = 1) -> float:
    """How long a pipeline rank is idle in a step, in microbatches' compute on that rank (the
    module docstring): p−1, (p−1)/v, or the zero-bubble schedules' idle chunk-forward slots
    over the 3·v slots of a microbatch; 0 without a pipeline (p ≤ 1); ``ValueError`` for a
    schedule not in ``SCHEDULES``."""
    if p <= 1:
        return 0.0
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    if schedule in FILL_THEN_DRAIN:
        return float(p - 1)
    if schedule in INTERLEAVED:
        return (p - 1) / v
    idle_chunk_slots = p - 1
    if schedule == "zbv":      # its warm-up leaves more below m = (3p−1)/2
        idle_chunk_slots = max(p - 1, 4 * p - 2 * m - 2)
    return idle_chunk_slots / (3 * v)


def bubble_fraction(schedule: str | None, p: int, m: int, v: int = 1) -> float:
    """The schedule's bubble as a fraction of the pipeline's step time, idle/(m + idle) with
    ``idle_microbatches`` (0 without a pipeline, p ≤ 1); ``ValueError`` for a schedule not in
    ``SCHEDULES``."""
    idle = idle_microbatches(schedule, p, m, v)
    return idle / (m + idle) if idle else 0.0


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
