"""Each rank's step as a program: the points of ``analysis/crossrank/graph.py`` read from its
aligned timeline and its rows of the (matched) instance table.

- A **call** point at each operation's arrival (``arrival_us`` of the instance table).
- A **wait** point at the end of each of the rank's wait regions (``RankTimeline.waits``:
  stretches in which its issuing thread — on GPUs its device — did nothing but wait, ending
  promptly after one of its operations completed). The operation waited for is the one whose
  completion ended the wait; ``resume_us`` is the time from that completion to the end of the
  wait as measured.
- An **end** point at the end of the step window.

``own_us`` of a point is the time since the previous point that is not inside a wait region.
Operations are the matched ones (``match_id``); a wait for an operation that has no match (a
barrier, an op outside the profiled steps) has no dependency in the graph: its time counts as
the rank's own.
"""
from __future__ import annotations

from typing import Iterator, Mapping, Protocol

import numpy as np
import pandas as pd

from meshscope.analysis.crossrank.graph import CALL, END, WAIT, Operation, Point, RankStep, \
    StepGraph
from meshscope.analysis import intervals as iv
from meshscope.analysis.rank_order import in_rank_order


def _own(a: float, b: float, waits: np.ndarray) -> float:
    """|[a, b] minus the wait regions|."""
    if b <= a:
        return 0.0
    return (b - a) - iv.length(iv.clip(waits, a, b))


def rank_step(rank: int, window: tuple[float, float], inst: pd.DataFrame, waits: np.ndarray,
              wait_until: np.ndarray) -> RankStep:
    """The program of one rank in one step. ``inst``: this rank's instances of the step (aligned,
    with ``match_id``); ``waits``/``wait_until``: its wait regions and the completion each ended
    at (aligned)."""
    s0, s1 = window
    events: list[tuple[float, int, str, float]] = []   # (time, order, kind, extra)
    ends_by_time = {}
    for mid, arrival, end in zip(inst["match_id"].tolist(), inst["arrival_us"].tolist(),
                                 inst["end_us"].tolist()):
        if mid:
            events.append((float(arrival), 0, CALL, mid))
            ends_by_time.setdefault(round(float(end), 3), mid)
    inside = (waits[:, 1] > s0) & (waits[:, 0] < s1) if len(waits) else np.zeros(0, bool)
    w_in = waits[inside] if len(waits) else waits
    u_in = wait_until[inside] if len(waits) else wait_until
    for (ws, we), until in zip(w_in, u_in):
        mid = ends_by_time.get(round(float(until), 3), "")
        if mid:
            events.append((float(we), 1, WAIT, (mid, float(until))))
    events.sort(key=lambda e: (e[0], e[1]))
    points, prev = [], s0
    clipped = iv.clip(w_in, s0, s1) if len(w_in) else iv.EMPTY
    for t, _, kind, extra in events:
        t = min(max(t, s0), s1)
        own = _own(prev, t, clipped)
        if kind == CALL:
            points.append(Point(CALL, t, own, extra))
        else:
            mid, until = extra
            points.append(Point(WAIT, t, own, mid, max(0.0, t - until)))
        prev = t
    points.append(Point(END, s1, _own(prev, s1, clipped)))
    return RankStep(rank, s0, points)


def operations(collectives: pd.DataFrame, p2p: pd.DataFrame, step: int) -> dict[str, Operation]:
    """The matched operations of a step, from ``matching.collective_table`` / ``p2p_table``."""
    out = {}
    for row in collectives[collectives["step"] == step].itertuples():
        out[row.match_id] = Operation(row.match_id, row.op, row.dim, [],
                                      float(row.after_last_us), float(row.completion_us))
    for row in p2p[p2p["step"] == step].itertuples():
        out[row.match_id] = Operation(row.match_id, "send/recv", row.dim, [row.src, row.dst],
                                      float(row.after_last_us), float(row.completion_us))
    return out


# The columns of its instance rows a rank's program reads (``rank_step``).
STEP_COLUMNS = ["match_id", "arrival_us", "end_us"]


class StepRows(Protocol):
    """A rank's aligned instance rows of a step, ``STEP_COLUMNS`` of them in the table's
    order (none: a frame without rows)."""

    def rows_of(self, rank: int, step: int) -> pd.DataFrame: ...


class TableRows:
    """``StepRows`` of a whole instance table: each rank's rows of each step taken when its
    program is built, from the columns it reads (a table per rank and step held all at once
    grew with the rank count)."""

    def __init__(self, inst: pd.DataFrame):
        self._slim = inst[STEP_COLUMNS]
        self._rows = inst.groupby(["rank", "step"]).indices if len(inst) else {}

    def rows_of(self, rank: int, step: int) -> pd.DataFrame:
        mine = self._rows.get((rank, step))
        return self._slim.iloc[mine] if mine is not None else self._slim.iloc[:0]


class StepGraphs(Mapping):
    """step → its graph over every rank that has that step (timelines and ``inst`` aligned),
    each built when it is asked for and not kept: every step's graph held at once was every
    rank's points of the whole profile (a 1.73M-event GPU rank: about 11 MB a rank, issue 51),
    one step's is the ranks' points of that step. ``operations(step)``: the step's matched
    operations alone, without building its graph."""

    def __init__(self, timelines: Mapping, inst: "pd.DataFrame | StepRows",
                 collectives: pd.DataFrame, p2p: pd.DataFrame):
        self._timelines, self._collectives, self._p2p = timelines, collectives, p2p
        self._steps = sorted(set().union(*(tl.steps for tl in timelines.values()))) \
            if timelines else []
        self._rows = TableRows(inst) if isinstance(inst, pd.DataFrame) else inst

    def operations(self, step: int) -> dict[str, Operation]:
        return operations(self._collectives, self._p2p, step)

    def __getitem__(self, step: int) -> StepGraph:
        if step not in self._steps:
            raise KeyError(step)
        ranks = {}
        for r, tl in in_rank_order(self._timelines):
            if step not in tl.steps:
                continue
            ranks[r] = rank_step(r, tl.steps[step], self._rows.rows_of(r, step), tl.waits,
                                 tl.wait_until)
        return StepGraph(step, ranks, self.operations(step))

    def __iter__(self) -> Iterator[int]:
        return iter(self._steps)

    def __len__(self) -> int:
        return len(self._steps)

    def __contains__(self, step: object) -> bool:
        return step in self._steps


def step_graphs(timelines: Mapping, inst: pd.DataFrame | StepRows, collectives: pd.DataFrame,
                p2p: pd.DataFrame) -> StepGraphs:
    """step → its graph over every rank that has that step, built on access (``StepGraphs``)."""
    return StepGraphs(timelines, inst, collectives, p2p)
