"""One rank's trace events of one step, by lane and with their names: what the dashboard's
Timeline draws under the report's segments (kernel, operator and collective names on hover, a
lane per CPU thread and GPU stream, an arrow from each launch to its kernel).

Nothing here is a report table: the page reads the rank's trace (``ingest.events.load_trace``,
through the analysis' parquet cache where there is one) and these functions cut it, so the
report stays what ``analyze`` wrote.

``named_events(events, start_us, end_us, shift_us=, max_events=)`` — the events of the event
table (``ingest/event_table.py``) that overlap ``[start_us, end_us)`` once ``shift_us`` is
subtracted from their times (the caller's shift puts them on the step's axis: the rank's
applied clock offset plus the step's start), clipped to it, ``NAMED_COLUMNS``:

=========== ====================================================================
column      meaning
=========== ====================================================================
lane        the trace's lane: ``cpu:<pid>:<tid>`` or ``gpu:<device>:<stream>``
lane_label  ``CPU thread <tid>`` / ``GPU <device> stream <stream>`` (``lane_label``)
name        the event's name; for a collective, its name and the collective
            (``nccl:all_reduce · allreduce``)
kind        the event table's ``kind`` (compute, comm, memory, other…)
start_us    start on the step's axis, µs (clipped to the range)
end_us      end, µs (clipped)
depth       nesting on its lane: 0 for an event inside no other of the lane, 1 for
            one inside a depth-0 event… (``nesting_depth``)
correlation the launch correlation id linking a GPU event and its runtime call;
            -1 where none
=========== ====================================================================

When more than ``max_events`` overlap the range, the longest are kept (at a step's scale the
others are narrower than a pixel) — ``NamedEvents.dropped`` says how many were not; the
nesting depths and ``NamedEvents.flows`` are those of every event in the range.

``launch_flows(named)`` — one row per GPU event whose launching runtime call is among
``named`` (same ``correlation``), ``FLOW_COLUMNS``: the launch's lane and start, the GPU
event's lane and start, and the GPU event's name.

``lane_order(lanes)`` — CPU threads first, then GPU streams, each by number.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pandas as pd

NAMED_COLUMNS = ["lane", "lane_label", "name", "kind", "start_us", "end_us", "depth",
                 "correlation"]
FLOW_COLUMNS = ["correlation", "launch_lane", "launch_us", "gpu_lane", "gpu_us", "name"]
MAX_EVENTS = 1500
_LANE = re.compile(r"^(cpu|gpu):([^:]*):(.*)$")


@dataclasses.dataclass(frozen=True)
class NamedEvents:
    events: pd.DataFrame        # NAMED_COLUMNS, by lane then start
    dropped: int                # events in the range left out (the shortest), 0 when none
    flows: pd.DataFrame         # FLOW_COLUMNS: launch_flows of every event in the range


def lane_label(lane: str) -> str:
    """``cpu:67844:4093687616`` → ``CPU thread 4093687616``; ``gpu:0:7`` → ``GPU 0 stream
    7``; any other lane as it is."""
    m = _LANE.match(str(lane))
    if m is None:
        return str(lane)
    side, a, b = m.groups()
    return f"CPU thread {b}" if side == "cpu" else f"GPU {a} stream {b}"


def _number(s: str) -> tuple[int, object]:
    return (0, int(s)) if s.lstrip("-").isdigit() else (1, s)


def lane_order(lanes) -> list[str]:
    """The lanes, CPU threads first, then GPU streams (by device, then stream), numbers in
    numeric order; a lane of another form last."""
    def key(lane: str):
        m = _LANE.match(lane)
        if m is None:
            return (2, (1, lane), (1, ""))
        side, a, b = m.groups()
        return (0 if side == "cpu" else 1, _number(a), _number(b))
    return sorted(dict.fromkeys(str(x) for x in lanes), key=key)


def nesting_depth(start_us: np.ndarray, end_us: np.ndarray) -> np.ndarray:
    """For intervals of one lane sorted by start (ties: the longer first), how many earlier
    intervals still open enclose each one: 0 for an interval inside none. An interval that
    starts inside another but outlives it counts as inside it (traces nest; a partial
    overlap is drawn one level down)."""
    depth = np.zeros(len(start_us), dtype=int)
    open_ends: list[float] = []
    for i, (s, e) in enumerate(zip(start_us, end_us)):
        while open_ends and open_ends[-1] <= s:
            open_ends.pop()
        depth[i] = len(open_ends)
        open_ends.append(e)
        # keep the stack's ends non-increasing from bottom to top: an interval that outlives
        # the one below it is still one level down, but closes with the later end
        if len(open_ends) > 1 and open_ends[-1] > open_ends[-2]:
            open_ends[-1] = open_ends[-2]
    return depth


def _names(ev: pd.DataFrame) -> pd.Series:
    name = ev["name"].astype("string").fillna("")
    if "coll_name" not in ev.columns:
        return name
    coll = ev["coll_name"].astype("string")
    has = coll.notna() & (coll != "") & (coll != name)
    return name.where(~has, name + " · " + coll.fillna(""))


def named_events(events: pd.DataFrame, start_us: float, end_us: float, *,
                 shift_us: float = 0.0, max_events: int = MAX_EVENTS) -> NamedEvents:
    """The events of ``events`` (the event table) in ``[start_us, end_us)`` of the axis
    ``time − shift_us``, clipped to it, the longest ``max_events`` of them (module
    docstring)."""
    ts = events["ts_us"].to_numpy(dtype=float) - shift_us
    te = events["end_us"].to_numpy(dtype=float) - shift_us
    inside = np.isfinite(ts) & np.isfinite(te) & (te > start_us) & (ts < end_us) & (te >= ts)
    ev = events[inside]
    s = np.maximum(ts[inside], start_us)
    e = np.minimum(te[inside], end_us)
    out = pd.DataFrame({"lane": ev["lane"].astype(str).to_numpy(),
                        "name": _names(ev).to_numpy(dtype=object),
                        "kind": ev["kind"].astype(str).to_numpy(),
                        "start_us": s, "end_us": e,
                        "correlation": ev["correlation"].to_numpy(dtype=np.int64)})
    out = out.assign(_len=out["end_us"] - out["start_us"]).sort_values(
        ["lane", "start_us", "_len"], ascending=[True, True, False], kind="stable")
    depth = np.zeros(len(out), dtype=int)
    lanes = out["lane"].to_numpy()
    starts, ends = out["start_us"].to_numpy(), out["end_us"].to_numpy()
    for lane in pd.unique(lanes):
        idx = np.flatnonzero(lanes == lane)
        depth[idx] = nesting_depth(starts[idx], ends[idx])
    out = out.assign(depth=depth, lane_label=[lane_label(x) for x in lanes])
    # the flows of every event in the range, the drawn ones or not: an arrow needs only the
    # two times
    flows = launch_flows(out)
    dropped = 0
    if len(out) > max_events:
        dropped = len(out) - max_events
        keep = out.nlargest(max_events, "_len", keep="first").index
        out = out.loc[out.index.isin(keep)]
    return NamedEvents(out.drop(columns="_len").reset_index(drop=True)[NAMED_COLUMNS],
                       dropped, flows)


def launch_flows(named: pd.DataFrame) -> pd.DataFrame:
    """From each host launch to the GPU event it launched: the rows of ``named`` joined on
    ``correlation`` (≥ 0), host side a ``cpu:`` lane, device side a ``gpu:`` lane;
    ``FLOW_COLUMNS``, by the GPU event's start."""
    has = named[named["correlation"] >= 0]
    cpu = has[has["lane"].str.startswith("cpu:")]
    gpu = has[has["lane"].str.startswith("gpu:")]
    if cpu.empty or gpu.empty:
        return pd.DataFrame(columns=FLOW_COLUMNS)
    # one launch per correlation id: the innermost (deepest) host event carrying it
    cpu = cpu.sort_values("depth").drop_duplicates("correlation", keep="last")
    j = gpu.merge(cpu, on="correlation", suffixes=("_gpu", "_cpu"))
    out = pd.DataFrame({"correlation": j["correlation"], "launch_lane": j["lane_cpu"],
                        "launch_us": j["start_us_cpu"], "gpu_lane": j["lane_gpu"],
                        "gpu_us": j["start_us_gpu"], "name": j["name_gpu"]})
    return out.sort_values("gpu_us", kind="stable").reset_index(drop=True)[FLOW_COLUMNS]
