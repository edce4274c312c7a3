"""The merged, aligned timeline of a run: every rank's trace on one clock, as a Chrome / Perfetto
trace (``export``). (The dashboard's timeline page draws the report's own aligned segments,
``timeline.parquet``; nothing here rebuilds step windows or segments.)

**Alignment.** The report's tables are read on the clock summary.json's ``table_clocks`` names:
the collective-instance table is on the aligned clock already (``analyze`` aligned it) and is
read as it is. Only the raw trace events — each rank's own clock — are moved, by the one
alignment function, ``analysis.crossrank.clocks.to_aligned_us`` with the offset the analysis
applied (``applied_us`` of ``clock_offsets.parquet``); offsets the analysis did not apply (too
small to tell from zero) are not applied here either, so the export shows exactly the clocks
the report's cross-rank figures used. Without a report the traces are exported on their own
clocks, and the export says so.

**The export** (Chrome's JSON trace event format, which ui.perfetto.dev and chrome://tracing
open; ``.json.gz`` is gzipped): one process per rank (``pid`` = the rank, named
``rank R (pp0·dp1)`` from run.json's mesh, sorted by rank), one thread per lane of that rank's
trace (its CPU threads or GPU streams, named as in the trace), every complete event of the
trace (``ph: X``, times in µs). Where the report has the collective-instance table
(``instances.parquet``, with the ``match_id`` that analysis/comm/matching.py gives the rows of
one operation on every rank), each rank gets a "matched collectives" thread with one slice per
operation it took part in (arrival → end), and the slices of each matched operation are linked
by one flow — for a collective from the first rank to arrive through the next ones to the last
(``ph: s``, ``t``…, ``f``), for a send/recv from the send's post to the end of the recv — so
the viewer draws an arrow through the ranks of every matched collective and message.
Where the report has its aligned timeline table (``timeline.parquet``, with the
``step_start_us`` anchor of each step), each rank also gets a "report breakdown" thread with
the report's own segments — ``compute``, ``comm <dim>``, ``wait <dim>`` (with the rank the
dependency graph charges it to), ``bubble`` — each at ``step_start_us + start_us``: what the
report counted, beside the events it counted from. Where a trace holds the allocator's
``[memory]`` events (``profile_memory``), each rank gets a counter track per device,
``memory cuda:0`` (``memory cpu``), with the ``allocated`` and ``reserved`` bytes after every
event (``_memory_events``), on the aligned clock. ``otherData.meshscope`` records the run,
the offsets applied per rank, the number of flows and anything left out.

Traces are read with ``analysis.ingest.events.load_trace`` (through the report's parquet
cache when the analysis left one); nothing is re-computed that the report holds.
"""
from __future__ import annotations

import dataclasses
import gzip
import logging
import pathlib

import numpy as np
import orjson
import pandas as pd

from meshscope.analysis.crossrank import clocks
from meshscope.analysis.errors import InputError
from meshscope.analysis.ingest.events import RankTrace, load_trace
from meshscope.analysis.memory import series
from meshscope.analysis.report.inputs import find_traces
from meshscope.collectors import run_dir as rd
from meshscope.collectors.run_dir import RunDirError
from meshscope.collectors.run_info import RunInfo
from meshscope.collectors.run_json import read_run_info

log = logging.getLogger("meshscope.analysis")

COLLECTIVES_TID = 1_000_000          # the "matched collectives" thread of every rank
SEGMENTS_TID = 1_000_001             # the "report breakdown" thread of every rank
FLOW_CAT = "meshscope.collective"


@dataclasses.dataclass
class AlignedRun:
    """Every readable trace of a run with the offsets to put them on one clock."""
    path: pathlib.Path
    traces: dict[int, RankTrace]
    applied_us: dict[int, float]        # rank -> offset subtracted from its times
    run: RunInfo | None
    instances: pd.DataFrame | None      # the report's collective-instance table
    collectives: pd.DataFrame | None    # the report's matched-collective table
    segments: pd.DataFrame | None       # the report's aligned timeline table (with its anchor)
    notes: list[str]


@dataclasses.dataclass(frozen=True)
class ExportSummary:
    path: pathlib.Path
    ranks: list[int]
    events: int
    flows: int
    applied_us: dict[int, float]
    notes: list[str]


def _table(report_dir: pathlib.Path | None, name: str) -> pd.DataFrame | None:
    if report_dir is None:
        return None
    p = rd.ReportDir(pathlib.Path(report_dir)).table(name)
    if not p.is_file():
        return None
    try:
        return pd.read_parquet(p)
    except Exception as e:  # a damaged table: export without it, and say so
        log.warning("%s: unreadable (%s)", p, e)
        return None


def load_aligned(path: pathlib.Path, report_dir: pathlib.Path | None = None) -> AlignedRun:
    """The traces under ``path`` (a run directory or a folder of traces) and the offsets of
    the report in ``report_dir`` (default ``path/report``). InputError when no trace can be
    read; unreadable ones are named in ``notes``."""
    path = pathlib.Path(path)
    report_dir = pathlib.Path(report_dir) if report_dir is not None else \
        rd.ReportDir.of_run(path).path
    files = find_traces(path)
    if not files:
        raise InputError(path, "no trace files (*.json, *.json.gz) found")
    cache = rd.ReportDir(report_dir).cache if report_dir.is_dir() else None
    notes: list[str] = []
    traces: dict[int, RankTrace] = {}
    for f in files:
        try:
            tr = load_trace(f, cache_dir=cache)
        except InputError as e:
            notes.append(str(e))
            continue
        if tr.rank in traces:
            notes.append(f"{f}: rank {tr.rank} already read from {traces[tr.rank].path}; "
                         f"skipped")
            continue
        traces[tr.rank] = tr
    if not traces:
        raise InputError(path, "no usable trace: " + "; ".join(notes))
    try:
        info = read_run_info(path) if path.is_dir() else None
    except RunDirError as e:
        notes.append(str(e))
        info = None
    offsets = _table(report_dir, "clock_offsets")
    if offsets is None or not {"rank", "applied_us"} <= set(offsets.columns):
        notes.append("no clock-offset table in the report: every rank on its own clock")
    report_applied = clocks.applied_by_rank(offsets)
    applied = {r: report_applied.get(r, 0.0) for r in traces}
    instances = _table(report_dir, "instances")
    if instances is not None and not {"rank", "match_id", "arrival_us", "end_us"} <= set(
            instances.columns):
        instances = None
    if instances is None:
        notes.append("no collective-instance table with match ids in the report (re-run "
                     "`meshscope analyze`): no flow arrows between ranks")
    segments = _table(report_dir, "timeline")
    if segments is not None and not {"rank", "step", "kind", "start_us", "end_us",
                                     "step_start_us"} <= set(segments.columns):
        notes.append("the report's timeline table has no step anchor (step_start_us; re-run "
                     "`meshscope analyze`): no report breakdown thread")
        segments = None
    return AlignedRun(path=path, traces=dict(sorted(traces.items())), applied_us=applied,
                      run=info, instances=instances,
                      collectives=_table(report_dir, "collectives"), segments=segments,
                      notes=notes)


def rank_name(rank: int, run: RunInfo | None) -> str:
    """``rank 3 (pp1·dp1)``: the rank and its mesh coordinates in dimensions of size > 1."""
    return run.rank_label(rank) if run is not None else f"rank {rank}"


def aligned_instances(run: AlignedRun) -> pd.DataFrame:
    """The matched rows of the report's instance table. ``analyze`` writes that table on the
    aligned clock already (``crossrank.clocks.align_instances`` subtracts each rank's
    ``applied_us`` from every time column), so nothing is subtracted here: the offsets are
    applied once (subtracting them again would put a rank whose clock runs 10 s ahead 10 s
    away from its own events)."""
    inst = run.instances
    if inst is None:
        return pd.DataFrame(columns=["rank", "match_id", "arrival_us", "end_us"])
    return inst[(inst["match_id"].astype(str) != "") & inst["match_id"].notna()
                & inst["rank"].isin(list(run.traces))].copy()


def _trace_events(run: AlignedRun) -> tuple[list[dict], int]:
    out: list[dict] = []
    n = 0
    for rank, tr in run.traces.items():
        off = run.applied_us.get(rank, 0.0)
        out.append({"ph": "M", "name": "process_name", "pid": rank,
                    "args": {"name": rank_name(rank, run.run)}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank,
                    "args": {"sort_index": rank}})
        ev = tr.events
        lanes = {lane: i + 1 for i, lane in enumerate(pd.unique(ev["lane"].astype(str)))}
        for lane, tid in lanes.items():
            out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                        "args": {"name": lane}})
        ts = clocks.to_aligned_us(ev["ts_us"].to_numpy(dtype=float), off).round(3)
        dur = ev["dur_us"].to_numpy(dtype=float).round(3)
        tids = ev["lane"].astype(str).map(lanes).to_numpy()
        names, cats, kinds = ev["name"].to_numpy(), ev["cat"].to_numpy(), ev["kind"].to_numpy()
        for i in range(len(ev)):
            if not (np.isfinite(ts[i]) and np.isfinite(dur[i])) or dur[i] < 0:
                continue
            out.append({"ph": "X", "name": names[i], "cat": cats[i] or kinds[i],
                        "ts": float(ts[i]), "dur": float(dur[i]), "pid": rank,
                        "tid": int(tids[i]), "args": {"kind": kinds[i]}})
            n += 1
    return out, n


def _collective_events(run: AlignedRun) -> tuple[list[dict], int]:
    inst = aligned_instances(run)
    if inst.empty:
        return [], 0
    out: list[dict] = [{"ph": "M", "name": "thread_name", "pid": r, "tid": COLLECTIVES_TID,
                        "args": {"name": "matched collectives"}}
                       for r in sorted(inst["rank"].astype(int).unique())]
    for row in inst.itertuples():
        label = f"{row.op} {getattr(row, 'dim', '')}".strip() if hasattr(row, "op") \
            else "collective"
        args = {"match_id": str(row.match_id)}
        for k in ("pg_ranks", "seq", "msg_bytes", "peer", "step"):
            v = getattr(row, k, None)
            if v is not None and not (isinstance(v, float) and v != v) and v is not pd.NA:
                args[k] = v.item() if hasattr(v, "item") else v
        out.append({"ph": "X", "name": label, "cat": "collective",
                    "ts": round(float(row.arrival_us), 3),
                    "dur": round(max(0.0, float(row.end_us - row.arrival_us)), 3),
                    "pid": int(row.rank), "tid": COLLECTIVES_TID, "args": args})
    flows = 0
    for match_id, g in inst.groupby("match_id", sort=False):
        if g["rank"].nunique() < 2:
            continue
        ops = set(g["op"]) if "op" in g else set()
        if ops == {"send", "recv"}:
            # A message: from the sender's post to the moment the receiver had it.
            g = g.assign(flow_ts=np.where(g["op"] == "send", g["arrival_us"],
                                      np.maximum(g["arrival_us"], g["end_us"] - 0.001)),
                         flow_order=np.where(g["op"] == "send", 0, 1)).sort_values("flow_order")
            name = "message"
        else:
            g = g.assign(flow_ts=g["arrival_us"]).sort_values(["arrival_us", "rank"])
            name = "collective"
        flows += 1
        last = len(g) - 1
        for i, row in enumerate(g.itertuples()):
            out.append({"ph": "s" if i == 0 else "f" if i == last else "t", "id": flows,
                        "name": name, "cat": FLOW_CAT, "bp": "e",
                        "ts": round(float(row.flow_ts), 3), "pid": int(row.rank),
                        "tid": COLLECTIVES_TID})
    return out, flows


def _memory_events(run: AlignedRun) -> tuple[list[dict], int]:
    """Each rank's allocator totals as counter tracks (``ph: C``), one per device: a point per
    ``[memory]`` event of its trace (``analysis/memory/series.py``: the allocator's totals, or
    rebuilt from the signed bytes where the trace has none), on the aligned clock —
    ``memory cuda:0`` with ``allocated`` and ``reserved`` (bytes)."""
    out: list[dict] = []
    n = 0
    for rank, tr in run.traces.items():
        off = run.applied_us.get(rank, 0.0)
        for s in series.split(tr.memory):
            ts = clocks.to_aligned_us(s.ts_us, off).round(3)
            name = f"memory {s.device}"
            alloc = s.allocated.tolist()
            res = s.reserved.tolist() if s.reserved is not None else None
            for i in range(len(s)):
                args = {"allocated": alloc[i]}
                if res is not None:
                    args["reserved"] = res[i]
                out.append({"ph": "C", "name": name, "cat": "meshscope.memory",
                            "ts": float(ts[i]), "pid": rank, "args": args})
            n += len(s)
    return out, n


def _segment_events(run: AlignedRun) -> list[dict]:
    """The report's aligned segments as slices of a "report breakdown" thread per rank, put
    on the aligned clock by their step's anchor (nothing recomputed)."""
    seg = run.segments
    if seg is None or seg.empty:
        return []
    seg = seg[seg["rank"].isin(list(run.traces))]
    out: list[dict] = [{"ph": "M", "name": "thread_name", "pid": int(r), "tid": SEGMENTS_TID,
                        "args": {"name": "report breakdown"}}
                       for r in sorted(seg["rank"].astype(int).unique())]
    dims = seg["dim"].fillna("").astype(str) if "dim" in seg else pd.Series("", seg.index)
    causes = seg["cause"] if "cause" in seg else pd.Series(-1, seg.index)
    ts = (seg["step_start_us"] + seg["start_us"]).round(3)
    dur = (seg["end_us"] - seg["start_us"]).clip(lower=0.0).round(3)
    for r, step, kind, dim, cause, t, d in zip(seg["rank"], seg["step"], seg["kind"], dims,
                                               causes, ts, dur):
        if not (np.isfinite(t) and np.isfinite(d)):
            continue
        args = {"step": int(step)}
        if kind == "wait" and pd.notna(cause) and int(cause) >= 0:
            args["charged_to_rank"] = int(cause)
        out.append({"ph": "X", "name": f"{kind} {dim}".strip() if kind in ("comm", "wait")
                    else kind, "cat": "meshscope.breakdown", "ts": float(t), "dur": float(d),
                    "pid": int(r), "tid": SEGMENTS_TID, "args": args})
    return out


def export(path: pathlib.Path, out: pathlib.Path, *,
           report_dir: pathlib.Path | None = None) -> ExportSummary:
    """Write the aligned timeline of the run at ``path`` to ``out`` (module docstring); gzip
    when ``out`` ends with ``.gz``."""
    run = load_aligned(path, report_dir)
    events, n = _trace_events(run)
    coll, flows = _collective_events(run)
    memory, counters = _memory_events(run)
    doc = {"traceEvents": events + coll + _segment_events(run) + memory,
           "displayTimeUnit": "ms",
           "otherData": {"meshscope": {
               "source": run.run.run_id if run.run is not None and run.run.run_id else
               pathlib.Path(path).name,
               "ranks": list(run.traces), "clock_offsets_applied_us":
                   {str(r): a for r, a in run.applied_us.items()},
               "flows": flows, "memory_counters": counters, "notes": run.notes}}}
    data = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.name.endswith(".gz"):
        with gzip.open(out, "wb", compresslevel=6) as f:
            f.write(data)
    else:
        out.write_bytes(data)
    return ExportSummary(path=out, ranks=list(run.traces), events=n, flows=flows,
                         applied_us=run.applied_us, notes=run.notes)

