"""The host operators each profiled step ran, by name: how many times and for how long.

``operator_totals`` — one row per (rank, step, name) of the rank's host operators: the events
that compute or communicate (``cpu_op`` events, and the communication ranges ``gloo:*`` /
``c10d::*`` / ``nccl:*`` whatever their category), with

========== ===============================================================================
column     meaning
========== ===============================================================================
rank       the rank
step       the profiled step whose host range (``ProfilerStep#N``, or the ranges
           ``--step-annotation`` names) holds the operator's start
name       the operator's name as the trace spells it (``aten::mm``, ``gloo:all_reduce``)
count      how many times it was called in the step (its launches)
total_us   their summed duration — inclusive: an operator's time holds the operators it
           called (``aten::linear`` holds its ``aten::addmm``), as HTA's TraceDiff counts
========== ===============================================================================

An operator that starts outside every profiled step is not counted. ``meshscope compare``
reads this table for the operators whose launch count changed between two runs
(``analysis/compare/``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from meshscope.analysis.ingest import classify

COLUMNS = ["rank", "step", "name", "count", "total_us"]


def operator_totals(rank: int, host: pd.DataFrame,
                    host_steps: dict[int, tuple[float, float]]) -> pd.DataFrame:
    """The rank's operators per profiled step (module docstring). ``host``: its host events
    (name, kind, ts_us, dur_us); ``host_steps``: step → its host range."""
    if not host_steps or host.empty:
        return pd.DataFrame(columns=COLUMNS)
    ops = host[host["kind"].isin([classify.COMPUTE, classify.COMMUNICATION])]
    keys = sorted(host_steps)
    starts = np.array([host_steps[k][0] for k in keys])
    ends = np.array([host_steps[k][1] for k in keys])
    ts = ops["ts_us"].to_numpy()
    i = np.searchsorted(starts, ts, side="right") - 1
    inside = (i >= 0) & (ts < ends[np.clip(i, 0, None)])
    if not inside.any():
        return pd.DataFrame(columns=COLUMNS)
    mine = ops.loc[inside, ["name", "dur_us"]].assign(
        step=np.asarray(keys, dtype=np.int64)[i[inside]])
    g = mine.groupby(["step", "name"], sort=True, observed=True).agg(
        count=("dur_us", "size"), total_us=("dur_us", "sum")).reset_index()
    g["name"] = g["name"].astype(object)
    g["count"] = g["count"].astype(np.int64)
    g["total_us"] = g["total_us"].astype(np.float64)
    return g.assign(rank=rank)[COLUMNS]
