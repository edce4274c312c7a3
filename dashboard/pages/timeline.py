"""Timeline: the ranks of one step on one time axis, their clocks aligned as the report aligned
them, coloured by compute / communication per dimension / waiting / bubble, with the longest
waits drawn as arrows from the rank that caused them; and the same merged timeline as a
Chrome/Perfetto trace to download (``/export/perfetto?run=ID``, ``meshscope export RUN
--perfetto``).

- ``timeline-graph``: one row per rank. The segments are the report's own
  (``timeline.parquet``, on the clock summary.json's ``table_clocks`` calls ``step``: aligned,
  µs from the step's earliest start, merged below the screen's resolution, each wait with the
  rank the dependency graph charges it to); the arrows are those charged waits, drawn at the
  wait's end from the rank charged to the rank that waited. Nothing is rebuilt from the traces
  here: a report without that table (an older schema) says so and asks for a re-analysis. The
  browser gets segments, never the event table. The step's critical path
  (``critical_path.parquet``, on the same axis; the path through the replayed dependency
  graph) is drawn over the lanes as one line. Stretches of one kind closer than 1/800 of the
  step are drawn as one bar (``_drawn``; the table merged them at 1/2000). Colours are the dashboard's ``COLOURS``:
  communication per dimension (``comm pp`` …) and ``wait`` never share one. Compute, bubble
  and communication are the breakdown's own sets (its ``compute_us``, ``bubble_us`` and
  ``exposed_comm_<dim>_us``, ``analysis/timeline/segments.py``); the waits, a part of the
  communication or bubble, are drawn thinner over them.
- ``?rank=R`` marks rank R's lane across the whole figure (an outlined band behind the bars,
  and the lane's label in bold).

- ``timeline-events-graph``: one rank's trace in the step (``?rank=R``, else the first
  rank), a lane per CPU thread and GPU stream, every event with its name on hover (kernels,
  operators, collectives with their collective), nested events drawn one level down in their
  lane, and an arrow from each host launch to the GPU work it launched (the trace's
  correlation ids). The events are not a report table: the report side reads them from the
  rank's trace (``analysis/report/trace_view.py``, through the analysis' parquet cache where
  there is one), moved by the rank's applied clock offset onto the step's axis; only the
  ``trace_view.MAX_EVENTS`` longest of a step are drawn (the others are narrower than a pixel
  at that scale: the note says how many) and the Perfetto download has every one. A trace
  larger than ``trace_view.TRACE_BYTES_LIMIT`` on disk is not read (the note says so). The static
  report, made of the report's tables alone, leaves this figure out.
- ``timeline-search``: a name typed there dims every event of the events figure that does
  not hold it (case-insensitive) and says how many match and the first (a clientside
  callback: nothing is asked of the server).
- Both figures show the whole step from its window's start (0: the earliest rank's step
  start, the table's own origin) to its end (``step_extent_us``), so time at the start of a
  step with nothing drawn — a data loader the GPU waits for — shows as the gap it is, not
  cut away by the axis' autorange.

Of many ranks (``common.many_ranks``) the two figures are two tabs (``timeline-tabs``), the
events figure drawn when its tab is opened: the 64-GPU-rank Timeline drew both, 16 lanes of
1,792 segments and 1,500 named events, in 1.9–2.8 s (docs/benchmarks.md).

Segments are kept per run and step (``_CACHE``) while the report is unchanged, the rank's
events per run, rank and step (``_EVENTS``).
"""
from __future__ import annotations

import logging
import threading

import dash
import pandas as pd
import plotly.graph_objects as go
from dash import Input, Output, State

import meshscope.analysis.report.trace_view as trace_view
from meshscope.analysis.report import reader

from ..sections import Facts, Figure, Link, Note, Search, Section
from .common import (COLOURS, TOP_K, absent, lanes_layout, many_ranks, PageContext, pick_step,
                     rank_label, top_ranks)

log = logging.getLogger("meshscope.dashboard")

MAX_ARROWS = 24
MAX_FLOWS = 600              # launch → GPU arrows drawn (the earliest); the rest are in Perfetto
_CACHE: dict[tuple, tuple[pd.DataFrame, list, dict]] = {}
_EVENTS: dict[tuple, object] = {}
_LOCK = threading.Lock()
# Colours of the events figure by the event table's kind: compute and communication as on the
# segments above; the rest in greys and browns.
EVENT_COLOURS = {"compute": COLOURS["compute"], "communication": COLOURS["comm"],
                 "memory": "#9D755D", "annotation": "#D8B5A5", "other": "#BAB0AC"}


def _from_report(ctx: PageContext, step: int):
    """The report's own aligned segments (``timeline.parquet``, schema 2): (segments, arrows);
    None when the report has no such table. An older table without ``dim`` or ``cause`` (read
    empty by ``reader.read_table``) gives undivided communication and no arrows."""
    if not ctx.report.has_table("timeline"):
        return None
    tab = ctx.report.table("timeline")
    seg = tab[tab["step"] == step]
    dim = seg["dim"].astype("string").fillna("")
    kind = seg["kind"].where(~((seg["kind"] == "comm") & (dim != "")), "comm " + dim)
    out = pd.DataFrame({"rank": seg["rank"].astype(int), "kind": kind,
                        "start_us": seg["start_us"], "end_us": seg["end_us"],
                        "step_start_us": seg["step_start_us"]})
    cause = pd.to_numeric(seg["cause"], errors="coerce")
    waits = seg[(seg["kind"] == "wait") & (cause >= 0) & (cause != seg["rank"])]
    waits = waits.assign(_len=waits["end_us"] - waits["start_us"]).nlargest(MAX_ARROWS, "_len")
    arrows = [(int(w.rank), int(w.cause), float(w.start_us), float(w.end_us))
              for w in waits.itertuples()]
    return out, arrows


def _segments(ctx: PageContext, step: int):
    """(segments, arrows, offsets applied) of ``step`` from the report's tables, or None when
    the report has no timeline table."""
    key = (str(ctx.report.entry.path), ctx.run_id, ctx.report.mtime_ns, step)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    own = _from_report(ctx, step)
    if own is None:
        return None
    out = (own[0], own[1], {c.rank: c.applied_us
                               for c in reader.clock_offsets(ctx.report.table("clock_offsets"))})
    with _LOCK:
        if len(_CACHE) > 32:
            _CACHE.clear()
        _CACHE[key] = out
    return out


DRAW_RESOLUTION = 800    # stretches of one kind closer than 1/this of the step drawn as one


def _drawn(seg: pd.DataFrame) -> pd.DataFrame:
    """``seg`` with the stretches of one kind on one rank that lie closer than 1/
    ``DRAW_RESOLUTION`` of the step joined (waits kept as they are): what a figure about a
    thousand pixels wide can show, in a fraction of the bars (each bar is an SVG path the
    browser draws)."""
    if seg.empty:
        return seg
    span = float(seg["end_us"].max() - seg["start_us"].min())
    gap = span / DRAW_RESOLUTION
    keep = seg[seg["kind"] == "wait"]
    parts = seg[seg["kind"] != "wait"].sort_values(["rank", "kind", "start_us"])
    prev_end = parts.groupby(["rank", "kind"])["end_us"].cummax().shift()
    first = (parts["rank"] != parts["rank"].shift()) | (parts["kind"] != parts["kind"].shift())
    run = (first | (parts["start_us"] - prev_end >= gap)).cumsum()
    joined = parts.groupby(run).agg(rank=("rank", "first"), kind=("kind", "first"),
                                    start_us=("start_us", "min"), end_us=("end_us", "max"))
    return pd.concat([joined, keep[joined.columns]], ignore_index=True)


def timeline_figure(ctx: PageContext, seg: pd.DataFrame, arrows: list, step: int,
                    end_us: float | None = None) -> go.Figure:
    title = f"Step {step} on the aligned clock"
    ranks = sorted(int(r) for r in seg["rank"].unique())
    shown = lane_ranks(ctx, seg)
    if len(shown) < len(ranks):
        title += f" — {len(shown)} of its {len(ranks)} ranks: the most waiting, and " \
                 f"the focused rank"
        seg = seg[seg["rank"].isin(shown)]
        arrows = [a for a in arrows if a[0] in shown and a[1] in shown]
        ranks = shown
    label = {r: rank_label(int(r), ctx.report) for r in ranks}
    order = [label[r] for r in ranks]
    seg = _drawn(seg)
    fig = go.Figure()
    # Compute, bubble and communication are disjoint (the breakdown's sets); a wait lies in
    # communication or bubble, so it is drawn last, over them.
    kinds = ["compute", "bubble"] + \
        sorted(k for k in seg["kind"].unique() if k.startswith("comm")) + ["wait"]
    for kind in kinds:
        g = seg[seg["kind"] == kind]
        if g.empty:
            continue
        fig.add_bar(name=kind, orientation="h", y=[label[r] for r in g["rank"]],
                    base=(g["start_us"] / 1e3).round(3).tolist(),
                    x=((g["end_us"] - g["start_us"]) / 1e3).round(3).tolist(),
                    marker_color=COLOURS.get(kind, "#E45756"), marker_line_width=0,
                    width=0.8 if kind in ("compute", "bubble") else 0.45 if kind != "wait"
                    else 0.25,
                    hovertemplate=f"%{{y}} {kind}<br>%{{base:.2f}} ms, %{{x:.3f}} ms long"
                                  "<extra></extra>")
    cp = ctx.report.table("critical_path")
    cp = cp[(cp["step"] == step) & cp["rank"].isin(list(label))].sort_values(
        ["order", "start_us"])
    if not cp.empty:
        fig.add_scatter(name="critical path (replayed)", mode="lines+markers",
                        x=[v for a, b in zip(cp["start_us"], cp["end_us"])
                           for v in (a / 1e3, b / 1e3)],
                        y=[label[r] for r in cp["rank"] for _ in (0, 1)],
                        line={"color": "#111", "width": 2}, marker={"size": 3},
                        hovertemplate="%{y}: %{x:.2f} ms<extra>critical path</extra>")
    for waiter, culprit, a, b in arrows:
        fig.add_annotation(x=b / 1e3, y=label.get(waiter), ax=b / 1e3, ay=label.get(culprit),
                           xref="x", yref="y", axref="x", ayref="y", showarrow=True,
                           arrowhead=2, arrowwidth=1.2, arrowcolor="#333", text="")
    lanes_layout(fig, title, "ms from the earliest rank's step start", order, 34)
    if end_us is not None:         # the whole step, from its window's start
        fig.update_xaxes(range=[0, end_us / 1e3])
    if ctx.state.rank in label:    # ?rank=R: that rank's lane marked across the figure
        _highlight(fig, order, label[ctx.state.rank])
    return fig


def lane_ranks(ctx: PageContext, seg: pd.DataFrame) -> list[int]:
    """The ranks the segments figure draws a lane for: every rank, but of many ranks
    (``common.many_ranks``) the ``TOP_K`` that waited longest in the step (ties: the later
    last segment) and the focused rank."""
    ranks = sorted(int(r) for r in seg["rank"].unique())
    if not many_ranks(ctx.report) or len(ranks) <= TOP_K:
        return ranks
    length = seg["end_us"] - seg["start_us"]
    waited = length[seg["kind"] == "wait"].groupby(seg["rank"]).sum()
    last = seg.groupby("rank")["end_us"].max()
    # waits first; the last segment's end (µs) only breaks ties between equal waits
    score = {r: float(waited.get(r, 0.0)) * 1e6 + float(last.get(r, 0.0)) for r in ranks}
    return top_ranks(score, focus=ctx.state.rank)  # type: ignore[arg-type]


def step_extent_us(ctx: PageContext, seg: pd.DataFrame, step: int) -> float:
    """The end of the step on the segments' axis (µs from the earliest rank's step start):
    the later of the last segment's end and the longest rank's step window (the breakdown's
    ``window_us``), so the axis holds the whole step, its empty start and end included."""
    bd = ctx.report.table("breakdown")
    windows = pd.to_numeric(bd.loc[bd["step"] == step, "window_us"], errors="coerce").dropna()
    ends = [float(seg["end_us"].max())] if len(seg) else []
    return max(ends + ([float(windows.max())] if len(windows) else []) + [0.0])


def rank_events(ctx: PageContext, rank: int, step: int, seg: pd.DataFrame,
                end_us: float) -> trace_view.NamedEvents | str:
    """The named events and launch flows of ``rank`` in ``step`` on the segments' axis, or why
    there are none (``trace_view.step_events``: the rank's trace moved by its applied clock
    offset and the step's anchor, cut to [0, ``end_us``)), kept while the report is
    unchanged."""
    key = (str(ctx.report.entry.path), ctx.run_id, ctx.report.mtime_ns, rank, step)
    with _LOCK:
        if key in _EVENTS:
            return _EVENTS[key]  # type: ignore[return-value]
    anchor = pd.to_numeric(seg["step_start_us"], errors="coerce").dropna() \
        if "step_start_us" in seg.columns else pd.Series(dtype=float)
    applied = {c.rank: c.applied_us
               for c in reader.clock_offsets(ctx.report.table("clock_offsets"))}
    out = trace_view.step_events(
        ctx.report.entry.path, ctx.report.report_dir, rank,
        applied_offset_us=applied.get(rank, 0.0),
        step_start_us=float(anchor.iloc[0]) if len(anchor) else None, end_us=end_us)
    if isinstance(out, str):
        log.warning("timeline events of %s rank %d: %s", ctx.run_id, rank, out)
    with _LOCK:
        if len(_EVENTS) > 16:
            _EVENTS.clear()
        _EVENTS[key] = out
    return out


def events_figure(named: pd.DataFrame, flows: pd.DataFrame, who: str, step: int,
                  end_us: float) -> go.Figure:
    """The rank's lanes (``trace_view.lane_order``: CPU threads, then GPU streams), each event
    a bar with its name on hover, nested events one level down in their lane; the launch →
    GPU arrows as one line trace."""
    order = [trace_view.lane_label(x) for x in trace_view.lane_order(named["lane"])]
    levels = named.groupby("lane_label")["depth"].max().clip(upper=5) + 1
    fig = go.Figure()
    kinds = [k for k in EVENT_COLOURS if k in set(named["kind"])] + \
        sorted(set(named["kind"]) - set(EVENT_COLOURS))
    for kind in kinds:
        g = named[named["kind"] == kind]
        n = g["lane_label"].map(levels).to_numpy()
        d = g["depth"].clip(upper=5).to_numpy()
        width = 0.84 / n
        fig.add_bar(name=kind, orientation="h", y=g["lane_label"].tolist(),
                    base=(g["start_us"] / 1e3).round(4).tolist(),
                    x=((g["end_us"] - g["start_us"]) / 1e3).round(4).tolist(),
                    # depth 0 at the top of the lane (the category axis runs upwards)
                    offset=(0.42 - (d + 1) * width).round(4).tolist(),
                    width=width.round(4).tolist(),
                    marker_color=EVENT_COLOURS.get(kind, "#79706E"), marker_line_width=0,
                    customdata=g["name"].tolist(), meta="named",
                    hovertemplate="%{customdata}<br>%{y} · " + kind +
                                  "<br>%{base:.3f} ms, %{x:.4f} ms long<extra></extra>")
    if not flows.empty:
        f = flows.head(MAX_FLOWS)
        xs, ys = [], []
        for r in f.itertuples():
            xs += [r.launch_us / 1e3, r.gpu_us / 1e3, None]
            ys += [trace_view.lane_label(r.launch_lane), trace_view.lane_label(r.gpu_lane),
                   None]
        fig.add_scatter(name="launch → GPU", mode="lines", x=xs, y=ys, hoverinfo="skip",
                        line={"color": "rgba(80, 80, 80, 0.35)", "width": 1})
    lanes_layout(fig, f"{who} in step {step}: its threads and streams, by name",
                 "ms from the earliest rank's step start", order, 46)
    fig.update_layout(bargap=0, hoverlabel={"namelength": -1})
    fig.update_xaxes(range=[0, end_us / 1e3])
    return fig


def _events_items(ctx: PageContext, seg: pd.DataFrame, step: int, end_us: float) -> list:
    ranks = sorted(int(r) for r in seg["rank"].unique())
    rank = ctx.state.rank if ctx.state.rank in ranks else ranks[0]
    who = rank_label(rank, ctx.report)
    got = rank_events(ctx, rank, step, seg, end_us)
    if isinstance(got, str):
        return [Note("timeline-events-none", f"{who}'s events are not drawn here: {got}. The "
                                             f"Perfetto download below holds them.")]
    named, flows = got, got.flows
    if named.events.empty:
        return [Note("timeline-events-none", f"{who}'s trace has no event in step {step}.")]
    more = [f"only its {len(named.events)} longest events are drawn: {named.dropped} shorter "
            f"ones (narrower than a pixel at this scale) are in the Perfetto download"] \
        if named.dropped else []
    if len(flows) > MAX_FLOWS:
        more.append(f"the first {MAX_FLOWS} of its {len(flows)} launch → GPU arrows are drawn")
    caption = (f"{who}'s trace in step {step} (?rank=R shows another rank): a lane per CPU "
               "thread and GPU stream, nested events one level down, grey lines from each "
               "launch to the GPU work it launched; hover an event for its name, zoom by "
               "dragging. " + (_sentence("; ".join(more)) if more else ""))
    return [Search("timeline-search", "timeline-events-graph",
                   "search events by name (kernel, operator, collective)"),
            Figure("timeline-events-graph",
                   events_figure(named.events, flows, who, step, end_us), caption)]


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


# The search box: every bar of the events figure whose name does not hold the text (any case)
# dimmed; the matches counted and the first named. In the browser only.
dash.clientside_callback(
    """
    function(text, fig) {
        const nu = window.dash_clientside.no_update;
        if (!fig || !fig.data) { return [nu, ""]; }
        const q = (text || "").trim().toLowerCase();
        let n = 0, first = null;
        const data = fig.data.map(t => {
            if (t.meta !== "named") { return t; }
            const op = (t.customdata || []).map((name, i) => {
                const hit = q !== "" && String(name).toLowerCase().includes(q);
                if (hit) {
                    n += 1;
                    if (first === null || t.base[i] < first[1]) { first = [name, t.base[i]]; }
                }
                return q === "" || hit ? 1 : 0.12;
            });
            return Object.assign({}, t, {marker: Object.assign({}, t.marker, {opacity: op})});
        });
        const said = q === "" ? "" : n === 0 ? `no event holds “${text}”` :
            `${n} event${n === 1 ? "" : "s"} hold “${text}”; the first: ${first[0]} at ` +
            `${first[1].toFixed(3)} ms`;
        return [Object.assign({}, fig, {data: data}), said];
    }
    """,
    Output("timeline-events-graph", "figure"), Output("timeline-search-result", "children"),
    Input("timeline-search", "value"), State("timeline-events-graph", "figure"),
    prevent_initial_call=True)


# Grey, not yellow: the bubble is yellow, and a marked lane must not read as one.
HIGHLIGHT = "rgba(60, 60, 60, 0.14)"


def _highlight(fig: go.Figure, order: list[str], lane: str) -> None:
    """Mark ``lane`` across the figure: a band with an outline the whole height of the lane,
    drawn below the bars so that their colours stay true (the bars take at most 0.8 of the
    lane, so the band shows around and between them), and its tick label in bold. The y axis
    is categorical, listing ``order`` reversed, so the lane's centre is its index there."""
    i = order[::-1].index(lane)
    fig.add_shape(type="rect", xref="paper", x0=0, x1=1, yref="y", y0=i - 0.5, y1=i + 0.5,
                  fillcolor=HIGHLIGHT, line={"width": 1.5, "color": "#444"},
                  layer="below", name=f"highlight {lane}")
    fig.update_yaxes(ticktext=[f"<b>{x}</b>" if x == lane else x for x in order[::-1]],
                     tickvals=order[::-1])


def sections(ctx: PageContext) -> list[Section]:
    step = pick_step(ctx.report, ctx.state.step)
    export = Link("perfetto-download", "the merged, aligned timeline as a Chrome/Perfetto "
                  "trace", "/export/perfetto" + ctx.state.query(rank=None, step=None,
                                                                  color=None),
                  before="Download ")
    if step is None:       # no traces (a records-only report): nothing to download either
        return [Section("Timeline", [Note("timeline-none", "This report has no profiled "
                                                           "steps: no trace to show or export.")])]
    seg, arrows, applied = _segments(ctx, step) or (None, [], {})
    if seg is None:
        return [Section("Timeline", [absent(ctx, "timeline", "timeline-none",
                                            "aligned timeline table (timeline.parquet)"),
                                     export])]
    if seg.empty:
        return [Section("Timeline", [Note("timeline-none", f"No trace holds step {step}."),
                                     export])]
    moved = {r: a for r, a in applied.items() if a}
    end_us = step_extent_us(ctx, seg, step)
    items = [Figure("timeline-graph", timeline_figure(ctx, seg, arrows, step, end_us),
                    "Arrows run, at the end of a wait, from the rank the dependency graph "
                    "charges it to into the rank that waited." if arrows else None),
             Facts("clock-applied", [("clocks moved", ", ".join(
                 f"rank {r} by {a / 1e3:.3f} ms" for r, a in sorted(moved.items())) or
                 "none (every offset within its uncertainty)")]), export]
    if ctx.state.static:    # the static report is the report's tables alone: no trace read
        return [Section(f"Step {step}", items)]
    # of many ranks, the two figures are two tabs: the second drawn when it is opened
    tabs = "timeline-tabs" if many_ranks(ctx.report) else None
    return [Section(f"Step {step}", items, tabs=tabs),
            Section("Threads and streams, by name", _events_items(ctx, seg, step, end_us),
                    id="timeline-events", tabs=tabs)]
