"""Per rank and step: where the step's time went (docs/metrics.md, "Step breakdown").

With W the step window (the ``ProfilerStep#N`` range; on GPUs extended to the next step's start),
C compute, M communication, P the pipeline window (pipelined runs only; see ``bubble``) and O
other device work, all clipped to W, ``step_rows`` gives one row per step of a rank (the
report's ``breakdown`` table is every rank's rows, with ``COLUMNS``):

======================= ==================================================================
column                  definition (all times in µs)
======================= ==================================================================
rank, step              the rank and the profiler step index
window_us               |W|
compute_us              |C|
comm_us                 |M|
overlapped_comm_us      |M ∩ C| — communication hidden behind compute
exposed_comm_us         |M \\ C \\ B| — communication nothing hides and that is not bubble
exposed_comm_<dim>_us   the part of exposed_comm_us from dimension <dim> (disjoint parts,
                        overlapping operations credited in the order of ``DIM_ORDER``; the
                        dimension of each operation is the instance table's, and ``unknown``
                        holds the rest: operations of no known dimension, barriers)
bubble_us               |B| with B = (P ∪ M_pp) \\ C — the pipeline window in which the rank
                        computes nothing, plus any exposed pipeline send/recv outside it
                        (a stage waiting for its neighbour is bubble, not transfer, wherever
                        the step boundary falls)
other_us                |O \\ (C ∪ M ∪ P)| — memcpy/memset and the like
idle_us                 |W| − |C ∪ M ∪ P ∪ O|
overlap_pct             |M ∩ C| / |M| × 100 (HTA's ``get_comm_comp_overlap``); NaN when M = ∅
======================= ==================================================================

The stacked breakdown (compute_us − overlapped_comm_us) + overlapped_comm_us + exposed_comm_us +
bubble_us + other_us + idle_us equals window_us exactly.

``step_tables`` gives, beside those rows, the exposed communication of each step split
further by operation — the report's ``exposed_comm`` table, long, ``EXPOSED_COLUMNS``:

=============== ===========================================================================
column          definition
=============== ===========================================================================
rank, step      as above
dim             the dimension (``DIM_ORDER``; ``unknown`` as above)
op              the operation (``all_reduce``, ``send``, ``all_to_all`` … as the instance
                table names it; ``unknown`` for exposed time of no known operation)
exposed_us      the part of ``exposed_comm_<dim>_us`` from that operation: within a
                dimension, overlapping operations are credited in the order of their names
=============== ===========================================================================

For each (rank, step, dim) the rows' ``exposed_us`` add up to ``exposed_comm_<dim>_us``
exactly; a (dim, op) with no exposed time in the step has no row.

``step_sets(tl, pipeline_windows, step)`` is one step of a rank as those interval sets
(``StepSets``), with the exposed set E = M \\ C \\ P and the bubble set B = P \\ C: the one
place they are formed. The columns above measure them, and the aligned timeline's segments
draw them (``segments.py``: its ``comm`` stretches are E credited by ``credit_by_dim``, its
``bubble`` stretches B), so the Timeline page and the breakdown show the same time.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from meshscope.analysis.gpu import idle as gpu_idle
from meshscope.analysis import intervals as iv
from meshscope.analysis.timeline.rank_timeline import RankTimeline
from meshscope.vocabulary import EXPOSED_COMM_ORDER

DIM_ORDER = EXPOSED_COMM_ORDER
BASE_COLUMNS = ["rank", "step", "window_us", "compute_us", "comm_us", "overlapped_comm_us",
                "exposed_comm_us", "bubble_us", "other_us", "idle_us", "overlap_pct"]
DIM_COLUMNS = [f"exposed_comm_{d}_us" for d in DIM_ORDER]
COLUMNS = BASE_COLUMNS + DIM_COLUMNS
EXPOSED_COLUMNS = ["rank", "step", "dim", "op", "exposed_us"]


def credit_by_dim(exposed: np.ndarray, comm_by_dim: dict[str, np.ndarray]
                  ) -> list[tuple[str, np.ndarray]]:
    """``exposed`` (disjoint intervals) split by dimension, in ``DIM_ORDER``: each dimension
    takes the part its communication covers that no earlier dimension took; ``unknown`` the
    rest. The one crediting of exposed communication — the breakdown's columns and the
    timeline's drawn segments both use it."""
    parts = []
    remaining = exposed
    for dim in DIM_ORDER[:-1]:
        part = iv.intersect(remaining, comm_by_dim.get(dim, iv.EMPTY))
        parts.append((dim, part))
        remaining = iv.subtract(remaining, part)
    parts.append((DIM_ORDER[-1], remaining))
    return parts


def overlap_pct(compute: np.ndarray, comm: np.ndarray) -> float:
    """|M ∩ C| / |M| × 100, NaN when there is no communication."""
    m = iv.length(comm)
    return iv.length(iv.intersect(comm, compute)) / m * 100.0 if m > 0 else math.nan


def window_per_step_us(breakdown: pd.DataFrame) -> pd.Series:
    """Per profiled step, the longest rank's step window (µs, ``COLUMNS``' ``window_us``): what
    that rank's bars of the breakdown add up to. Empty without rows."""
    if breakdown.empty:
        return pd.Series(dtype=float)
    return breakdown.groupby("step")["window_us"].max()


def rank_means(table: pd.DataFrame) -> pd.DataFrame:
    """A per-(rank, step) table (the breakdown, the idle table) as each rank's mean over its
    profiled steps: one row per rank, indexed by rank, every column but ``step`` — the one
    per-rank mean (summary.json's ``per_rank_mean`` and ``gpu_idle_per_rank_mean``, the
    findings and compare read it); empty without rows."""
    rest = table.drop(columns=["step"], errors="ignore")
    if len(table):
        return rest.groupby("rank").mean()
    return rest.set_index("rank") if "rank" in rest else rest


def mean_window_us(breakdown: pd.DataFrame) -> float | None:
    """``window_per_step_us`` averaged over the profiled steps (summary.json's ``window_us``);
    None without rows."""
    per = window_per_step_us(breakdown)
    return float(per.mean()) if len(per) else None


@dataclasses.dataclass(frozen=True)
class StepSets:
    """One step of one rank as interval sets (module docstring), each clipped to the step's
    window W = [start, end): C, M, O, P, and from them ``exposed`` (M \\ C \\ P: the
    ``exposed_comm_us`` of the breakdown) and ``bubble`` (P \\ C: its ``bubble_us``)."""
    start: float
    end: float
    compute: np.ndarray
    comm: np.ndarray
    other: np.ndarray
    pipeline: np.ndarray
    exposed: np.ndarray
    bubble: np.ndarray


def step_sets(tl: RankTimeline, pipeline_windows: dict[int, np.ndarray] | None, step: int
              ) -> StepSets:
    """The sets of ``step`` of ``tl`` (``StepSets``); ``pipeline_windows``: the rank's pipeline
    window per step (None or empty without a pipeline)."""
    start, end = tl.steps[step]
    C, M, O = (iv.clip(x, start, end) for x in (tl.compute, tl.comm, tl.other))
    P = _pipeline_set(tl, pipeline_windows, step, start, end)
    return StepSets(start=start, end=end, compute=C, comm=M, other=O, pipeline=P,
                    exposed=iv.subtract(iv.subtract(M, C), P), bubble=iv.subtract(P, C))


def _pipeline_set(tl: RankTimeline, pipeline_windows: dict[int, np.ndarray] | None, step: int,
                  start: float, end: float) -> np.ndarray:
    """P of one step clipped to its window [start, end): the pipeline window and, on pipelined
    runs, the rank's pp send/recv (module docstring, ``bubble_us``)."""
    P = iv.clip((pipeline_windows or {}).get(step, iv.EMPTY), start, end)
    if pipeline_windows:
        P = iv.merge(P, iv.clip(tl.comm_by_dim.get("pp", iv.EMPTY), start, end))
    return P


def step_rows(tl: RankTimeline, pipeline_windows: dict[int, np.ndarray] | None = None
              ) -> list[dict]:
    """One row per step of the rank (module docstring), as dicts: the report makes one table of
    every rank's rows, faster than a table per rank."""
    return step_tables(tl, pipeline_windows)[0]


def step_tables(tl: RankTimeline, pipeline_windows: dict[int, np.ndarray] | None = None
                ) -> tuple[list[dict], list[dict]]:
    """(``step_rows``, the rank's ``exposed_comm`` rows): the breakdown of every step and its
    exposed communication per (dimension, op), from one pass (module docstring)."""
    rows, long_rows = [], []
    for step in sorted(tl.steps):
        sets = step_sets(tl, pipeline_windows, step)
        start, end = sets.start, sets.end
        C, M, O, P, exposed = sets.compute, sets.comm, sets.other, sets.pipeline, sets.exposed
        row = {
            "rank": tl.rank, "step": step, "window_us": end - start,
            "compute_us": iv.length(C), "comm_us": iv.length(M),
            "overlapped_comm_us": iv.length(iv.intersect(M, C)),
            "exposed_comm_us": iv.length(exposed),
            "bubble_us": iv.length(sets.bubble),
            "other_us": iv.length(iv.subtract(O, iv.merge(C, M, P))),
            "idle_us": (end - start) - iv.length(iv.merge(C, M, P, O)),
            "overlap_pct": overlap_pct(C, M),
        }
        for dim, part in credit_by_dim(exposed, tl.comm_by_dim):
            row[f"exposed_comm_{dim}_us"] = iv.length(part)
            long_rows += _by_op(tl, step, dim, part)
        rows.append(row)
    return rows, long_rows


def _by_op(tl: RankTimeline, step: int, dim: str, part: np.ndarray) -> list[dict]:
    """The ``exposed_comm`` rows of one step's exposed time ``part`` of ``dim``: split over
    that dimension's operations in the order of their names, the rest ``unknown``."""
    out = []
    if not len(part):
        return out
    remaining = part
    for (d, op), x in sorted(tl.comm_by_dim_op.items()):
        if d != dim or op == "unknown" or not len(remaining):
            continue
        mine = iv.intersect(remaining, x)
        if len(mine):
            out.append({"rank": tl.rank, "step": step, "dim": dim, "op": op,
                        "exposed_us": iv.length(mine)})
            remaining = iv.subtract(remaining, mine)
    if iv.length(remaining) > 0:
        out.append({"rank": tl.rank, "step": step, "dim": dim, "op": "unknown",
                    "exposed_us": iv.length(remaining)})
    return out


def trace_overlap(tl: RankTimeline) -> dict:
    """Whole-trace overlap of one rank over the events HTA's ``get_comm_comp_overlap`` selects
    (on GPU traces, kernels launched before the last profiled step; see
    ``step_windows.complete_steps``). Columns: rank, compute_us, comm_us, overlapped_comm_us,
    overlap_pct."""
    C, M = tl.trace_compute, tl.trace_comm
    return {"rank": tl.rank, "compute_us": iv.length(C), "comm_us": iv.length(M),
            "overlapped_comm_us": iv.length(iv.intersect(M, C)), "overlap_pct": overlap_pct(C, M)}


IDLE_CAUSES = gpu_idle.CAUSES
TRACE_OVERLAP_COLUMNS = ["rank", "compute_us", "comm_us", "overlapped_comm_us", "overlap_pct"]
IDLE_COLUMNS = ["rank", "step", "idle_us"] + [f"idle_{c}_us" for c in IDLE_CAUSES] + \
    ["slow_launch_us"]


def idle_rows(tl: RankTimeline, pipeline_windows: dict[int, np.ndarray] | None = None
              ) -> list[dict]:
    """Where the device's idle time of each step went (GPU ranks; none on CPU-only traces): one
    row per step, ``IDLE_COLUMNS``. ``idle_<cause>_us`` is the time of the step window W that
    ``analysis/gpu/idle.py`` charges to that cause, less the pipeline window P (bubble, as in
    ``step_rows``), so the parts add up to ``step_rows``' ``idle_us`` exactly;
    ``slow_launch_us`` is the part of ``idle_launch_us`` inside launch calls of at least 1 ms
    (``idle.SLOW_LAUNCH``: start-up work, not a cause of its own)."""
    if not tl.on_gpu or not tl.idle_causes:
        return []
    rows = []
    for step, (start, end) in sorted(tl.steps.items()):
        P = _pipeline_set(tl, pipeline_windows, step, start, end)
        row = {"rank": tl.rank, "step": step}
        total = 0.0
        for cause in IDLE_CAUSES:
            part = iv.subtract(iv.clip(tl.idle_causes.get(cause, iv.EMPTY), start, end), P)
            row[f"idle_{cause}_us"] = iv.length(part)
            total += row[f"idle_{cause}_us"]
        row["idle_us"] = total
        row["slow_launch_us"] = iv.length(iv.subtract(iv.clip(
            tl.idle_causes.get(gpu_idle.SLOW_LAUNCH, iv.EMPTY), start, end), P))
        rows.append(row)
    return rows
