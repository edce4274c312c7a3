"""Pipeline bubbles: per stage and step, the share of the pipeline window in which the stage
computes nothing, beside what the schedule's theory predicts.

The pipeline window of a step spans, over the ranks of one pipeline (the ``pp`` process group),
from the first microbatch annotation to start to the last one to end (``meshscope/forward``,
``backward``, ``weight-grad``; traces without them fall back to the ``meshscope/pipeline``
range): from the first stage's first forward to the last backward anywhere. Each stage's bubble
is measured against that shared window, so a stage that waits at the start or finishes early is
charged for it, as in the schedule diagrams; time a rank spends before the pipeline starts
(waiting for the previous step's stragglers) is not bubble.

Theory, for p stages, m microbatches and v virtual stages per rank, as a fraction of the
pipeline window (Huang et al., 2019; Narayanan et al., 2021): GPipe and 1F1B (p−1)/(m+p−1);
interleaved 1F1B and looped BFS (p−1)/(v·m+p−1); the zero-bubble schedules (ZB1P, ZB-V,
DualPipeV) (p−1)/(3·v·m+p−1) when F, I and W are balanced, as torch's own orders leave
(``meshscope/theory/schedules.py`` holds the closed forms and where each holds).

``bubble_table`` columns: rank, stage, step, window_start_us (the pipeline window's start, µs
from the step's earliest start over all ranks — the origin of ``critical_path.parquet`` and
``timeline.parquet``; ``microbatches.parquet`` times are relative to this window's start),
pipeline_window_us, busy_us (|C ∩ window|),
bubble_fraction (1 − busy_us / pipeline_window_us), theory_fraction, schedule, stages,
microbatches. (The bubble *time* of a step is one column, ``bubble_us`` of the step breakdown,
``analysis/timeline/breakdown.py``, which stacks it with the other segments.)
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from meshscope.analysis import intervals as iv
from meshscope.analysis.timeline.rank_timeline import RankTimeline
from meshscope.analysis.rank_order import in_rank_order
from meshscope.collectors.run_info import RunInfo
from meshscope.theory.schedules import SCHEDULES, bubble_fraction

COLUMNS = ["rank", "stage", "step", "window_start_us", "pipeline_window_us", "busy_us",
           "bubble_fraction",
           "theory_fraction", "schedule", "stages", "microbatches"]


def theory_fraction(schedule: str | None, p: int, m: int, v: int = 1) -> float:
    """The schedule's bubble as a fraction of the pipeline window — the closed form of
    ``meshscope.theory.schedules.bubble_fraction``, the one definition the planner uses too;
    NaN for a schedule it does not know (a foreign trace's) or an impossible m or v."""
    if p <= 1:
        return 0.0
    if m < 1 or v < 1 or schedule not in SCHEDULES:
        return math.nan
    return bubble_fraction(schedule, p, m, v)


def pipeline_groups(run: RunInfo | None, ranks: list[int]) -> list[list[int]]:
    """The ranks of each pipeline (run.json's pp groups), else each rank on its own."""
    if run is not None:
        groups = [list(g.ranks) for g in run.groups_along("pp")]
        if groups:
            return groups
    return [[r] for r in ranks]


def _stage_of(rank: int, tl: RankTimeline, run: RunInfo | None) -> int:
    if run is not None:
        stage = run.stage_of(rank)
        if stage is not None:
            return stage
    if not tl.microbatches.empty:
        return int(tl.microbatches["stage"].mode().iloc[0])
    return 0


def _work_span(tl: RankTimeline, start: float, end: float) -> np.ndarray:
    """The rank's pipeline work within [start, end): microbatch spans, else pipeline ranges."""
    mb = tl.microbatches
    if not mb.empty:
        ts, ends = mb["ts_us"].to_numpy(), mb["end_us"].to_numpy()
        inside = (ts >= start) & (ends <= end)
        if inside.any():
            return np.array([[ts[inside].min(), ends[inside].max()]])
    return iv.clip(tl.pipeline, start, end)


def pipeline_windows(timelines: dict[int, RankTimeline], run: RunInfo | None
                     ) -> dict[int, dict[int, np.ndarray]]:
    """rank → step → the shared pipeline window (an interval set) of that rank's pipeline.
    The timelines must be on aligned clocks (``analysis/crossrank/clocks.py``): the window is
    a cross-rank figure."""
    out: dict[int, dict[int, np.ndarray]] = {r: {} for r in timelines}
    for group in pipeline_groups(run, sorted(timelines)):
        present = [r for r in group if r in timelines]
        steps = set().union(*(timelines[r].steps for r in present)) if present else set()
        for step in steps:
            spans = []
            for r in present:
                w = timelines[r].steps.get(step)
                if w is not None:
                    spans.append(_work_span(timelines[r], *w))
            merged = iv.merge(*spans) if spans else iv.EMPTY
            window = iv.EMPTY if not len(merged) else np.array(
                [[merged[0, 0], merged[-1, 1]]])
            for r in present:
                out[r][step] = window
    return out


def bubble_table(timelines: dict[int, RankTimeline], windows: dict[int, dict[int, np.ndarray]],
                 run: RunInfo | None) -> pd.DataFrame:
    stages = run.pipeline_stages if run is not None else 1
    if stages <= 1:
        return pd.DataFrame(columns=COLUMNS)
    schedule, m, v = run.schedule, run.microbatches, run.virtual_stages
    theory = theory_fraction(schedule, stages, m, v)
    rows = []
    origin: dict[int, float] = {}
    for tl in timelines.values():
        for step, (start, _) in tl.steps.items():
            origin[step] = min(origin.get(step, start), start)
    for rank, tl in in_rank_order(timelines):
        stage = _stage_of(rank, tl, run)
        for step, window in sorted(windows.get(rank, {}).items()):
            total = iv.length(window)
            if total <= 0:
                continue
            busy = iv.length(iv.intersect(tl.compute, window))
            rows.append({"rank": rank, "stage": stage, "step": step,
                         "window_start_us": float(window[0, 0]) - origin[step],
                         "pipeline_window_us": total, "busy_us": busy,
                         "bubble_fraction": (total - busy) / total,
                         "theory_fraction": theory, "schedule": schedule, "stages": stages,
                         "microbatches": m})
    return pd.DataFrame(rows, columns=COLUMNS)
