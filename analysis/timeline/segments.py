"""The aligned per-rank timeline of each profiled step, coarse enough to draw: what the
dashboard's timeline page and the Perfetto export show without reading the traces again.

``segments(timelines, windows, charged)`` — one row per stretch of one kind on one rank in one
step, on aligned clocks, times relative to the step's earliest start over the ranks:

======== ============================================================================
column   meaning
======== ============================================================================
rank     the rank
step     the profiled step
kind     ``compute`` (C); ``comm`` (communication nothing hides: the breakdown's exposed
         set M \\ C \\ P); ``bubble`` (the breakdown's bubble set P \\ C: pipeline window,
         and on a pipeline the pp send/recv, without compute); ``wait`` (the issuing thread
         waiting for an operation: drawn over the others — a wait is communication, so it
         lies in a ``comm`` or ``bubble`` stretch)
dim      for comm and wait: the dimension (the instance table's); else ""
cause    for wait: the rank the dependency graph charges the wait to
         (``analysis/crossrank/graph.waits_charged``); -1 when none
start_us start, µs from the step's earliest start
end_us   end, µs
step_start_us the step's earliest start over the ranks on the aligned clock (µs, the
         instance table's clock): ``step_start_us + start_us`` puts a segment back on that
         clock, which is how the Perfetto export draws these segments beside the trace
         events without rebuilding them
======== ============================================================================

The compute, comm and bubble stretches are the breakdown's own sets of the step
(``breakdown.step_sets``; comm split by dimension with ``breakdown.credit_by_dim``), so on each
rank and step they add up to its ``compute_us``, ``exposed_comm_<dim>_us`` and ``bubble_us``
— up to the merging below. Stretches of one kind closer than 1/``RESOLUTION`` of the step are
merged, so a step has at most a few thousand rows per rank however many events its trace
holds.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import pandas as pd

from meshscope.analysis.timeline.breakdown import credit_by_dim, step_sets
from meshscope.analysis.rank_order import in_rank_order

RESOLUTION = 2000
COLUMNS = ["rank", "step", "kind", "dim", "cause", "start_us", "end_us", "step_start_us"]


def _coarse(x: np.ndarray, gap: float) -> np.ndarray:
    """Merge the intervals of ``x`` separated by less than ``gap``."""
    if len(x) < 2:
        return x
    keep = np.concatenate([[True], x[1:, 0] - x[:-1, 1] >= gap])
    starts = x[keep, 0]
    idx = np.flatnonzero(keep)
    ends = np.maximum.reduceat(x[:, 1], idx)
    return np.column_stack([starts, ends])


def segments(timelines: dict, windows: dict, charged: list[tuple]) -> pd.DataFrame:
    """``timelines``: rank → aligned ``RankTimeline``; ``windows``: rank → step → pipeline
    window (the breakdown's, empty without a pipeline); ``charged``: (step, waiter, cause, µs,
    end) of the graph's waits."""
    frames = list(segment_frames(timelines, windows, charged))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)


# Rows of the segments made into one frame at a time (``segment_frames``): as Python tuples a
# row is about 200 bytes, and every rank's rows at once were a rank count of megabytes while
# the report was put together (issue 51); a frame of this many rows is a part of the kept table.
ROWS_PER_FRAME = 65_536


def segment_frames(timelines: dict, windows: dict, charged: list[tuple],
                   rows_per_frame: int = ROWS_PER_FRAME) -> Iterator[pd.DataFrame]:
    """``segments``' rows, in its order, as frames of whole ranks' steps made once their rows
    reach ``rows_per_frame`` (the last one fewer; none without rows)."""
    # Each step's earliest start and latest end over the ranks, in one pass over the timelines
    # (read from disk on access, ``report/spill``), before the rows: a rank's at a time.
    span_of: dict[int, tuple[float, float]] = {}
    for tl in timelines.values():
        for step, (a, b) in tl.steps.items():
            lo, hi = span_of.get(step, (a, b))
            span_of[step] = (min(lo, a), max(hi, b))
    cause_at = {(step, w, round(end, 1)): c for step, w, c, _, end in charged}
    rows = []
    for step in sorted(span_of):
        t0, last_end = span_of[step]
        width = last_end - t0
        gap = width / RESOLUTION if width > 0 else 0.0
        for r, tl in in_rank_order(timelines):
            if step not in tl.steps:
                continue
            a, b = tl.steps[step]
            sets = step_sets(tl, windows.get(r), step)
            parts = [("compute", "", sets.compute), ("bubble", "", sets.bubble)]
            parts += [("comm", dim, part)
                      for dim, part in credit_by_dim(sets.exposed, tl.comm_by_dim)]
            for kind, dim, x in parts:
                for s, e in _coarse(x, gap):
                    rows.append((r, step, kind, dim, -1, s - t0, e - t0, t0))
            inside = (tl.waits[:, 1] > a) & (tl.waits[:, 0] < b) if len(tl.waits) else \
                np.zeros(0, dtype=bool)
            w = tl.waits[inside]
            for (s, e), dim in zip(w, _wait_dims(w, tl.comm_by_dim)):
                cause = cause_at.get((step, r, round(float(e), 1)), -1)
                rows.append((r, step, "wait", dim, int(cause), max(s, a) - t0, min(e, b) - t0,
                             t0))
            if len(rows) >= rows_per_frame:
                yield pd.DataFrame(rows, columns=COLUMNS)
                rows = []
    if rows:
        yield pd.DataFrame(rows, columns=COLUMNS)


def _wait_dims(waits: np.ndarray, comm_by_dim: dict[str, np.ndarray]) -> list[str]:
    """For each wait region, the first dimension (in ``comm_by_dim``'s order) whose
    communication overlaps it, else "unknown". A region [s, e) overlaps a sorted disjoint set
    where the set's first interval that ends after s starts before e."""
    dims = np.full(len(waits), "unknown", dtype=object)
    open_ = np.ones(len(waits), dtype=bool)
    if not len(waits):
        return dims.tolist()
    s, e = waits[:, 0], waits[:, 1]
    for dim, x in comm_by_dim.items():
        if not len(x):
            continue
        first = np.searchsorted(x[:, 1], s, side="right")
        ok = first < len(x)
        hit = np.zeros(len(waits), dtype=bool)
        hit[ok] = x[first[ok], 0] < e[ok]
        hit &= open_ & (s < e)
        dims[hit] = dim
        open_ &= ~hit
    return dims.tolist()
