"""The pipeline bubble in closed form, and how many microbatches each schedule keeps in flight.

With p pipeline ranks, m microbatches and v stages per rank, the share of a step a stage spends
idle when every forward and backward takes the same time (Narayanan et al., 2021, §2.2):

- GPipe (Huang et al., 2019) and 1F1B (PipeDream-Flush): (p−1)/(m+p−1) of the step — the
  bubble is (p−1)/m of the ideal time;
- interleaved 1F1B (Narayanan et al., 2021, §2.2.2) and looped BFS (Lamy-Poirier, 2023), which
  loop each microbatch v times round the ranks: (p−1)/(v·m+p−1);
- the zero-bubble schedules (ZB1P interleaved, ZB-V; Qi et al., 2024) and DualPipeV
  (DeepSeek-V3 report, 2024) fill the bubble with the deferred weight-gradient work: 0 when
  forward, input-gradient and weight-gradient times are balanced (they are not, exactly, on a
  real machine).

``in_flight`` is how many (stage-)microbatches' activations a pipeline rank holds at its peak,
the factor the activation memory of a stage is multiplied by: all m for GPipe and looped BFS
(every forward before any backward), p − r for 1F1B on rank r (its warm-up forwards plus one),
and torch's own warm-up count for the interleaved schedules
(``torch.distributed.pipelining.schedules``: (v−1)·p + 2·(p−1−r) + 1 chunk-microbatches).
"""
from __future__ import annotations

from ..schedules import SCHEDULES


def theory_fraction(schedule: str | None, p: int, m: int, v: int = 1) -> float:
    """The bubble as a fraction of the pipeline's step time (0 without a pipeline)."""
    if p <= 1:
        return 0.0
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if schedule in ("interleaved-1f1b", "looped-bfs"):
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
