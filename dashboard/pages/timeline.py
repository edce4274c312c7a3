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
  graph) is drawn over the lanes as one line. Colours are the dashboard's ``COLOURS``:
  communication per dimension (``comm pp`` …) and ``wait`` never share one. Compute, bubble
  and communication are the breakdown's own sets (its ``compute_us``, ``bubble_us`` and
  ``exposed_comm_<dim>_us``, ``analysis/timeline/segments.py``); the waits, a part of the
  communication or bubble, are drawn thinner over them.
- ``?rank=R`` marks rank R's lane across the whole figure (an outlined band behind the bars,
  and the lane's label in bold).

Segments are kept per run and step (``_CACHE``) while the report is unchanged.
"""
from __future__ import annotations

import threading

import pandas as pd
import plotly.graph_objects as go

from meshscope.analysis.report import reader

from ..sections import Facts, Figure, Link, Note, Section
from .common import COLOURS, absent, lanes_layout, PageContext, pick_step, rank_label

MAX_ARROWS = 24
_CACHE: dict[tuple, tuple[pd.DataFrame, list, dict]] = {}
_LOCK = threading.Lock()


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
                        "start_us": seg["start_us"], "end_us": seg["end_us"]})
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


def timeline_figure(ctx: PageContext, seg: pd.DataFrame, arrows: list, step: int) -> go.Figure:
    ranks = sorted(seg["rank"].unique())
    label = {r: rank_label(int(r), ctx.report) for r in ranks}
    order = [label[r] for r in ranks]
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
    lanes_layout(fig, f"Step {step} on the aligned clock",
                 "ms from the earliest rank's step start", order, 34)
    if ctx.state.rank in label:    # ?rank=R: that rank's lane marked across the figure
        _highlight(fig, order, label[ctx.state.rank])
    return fig


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
    items = [Figure("timeline-graph", timeline_figure(ctx, seg, arrows, step),
                    "Arrows run, at the end of a wait, from the rank the dependency graph "
                    "charges it to into the rank that waited." if arrows else None),
             Facts("clock-applied", [("clocks moved", ", ".join(
                 f"rank {r} by {a / 1e3:.3f} ms" for r, a in sorted(moved.items())) or
                 "none (every offset within its uncertainty)")]), export]
    return [Section(f"Step {step}", items)]
