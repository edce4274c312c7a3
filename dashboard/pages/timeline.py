"""Timeline: the ranks of one step on one time axis, their clocks aligned as the report aligned
them, coloured by compute / communication per dimension / waiting / bubble, with the longest
waits drawn as arrows from the rank that caused them; and the same merged timeline as a
Chrome/Perfetto trace to download (``/export/perfetto?run=ID``, ``meshscope export RUN
--perfetto``).

- ``timeline-graph``: one row per rank. The segments are the report's own
  (``timeline.parquet``: aligned, merged below the screen's resolution, each wait with the
  rank the dependency graph charges it to). An older report without that table has them
  rebuilt from the traces (``analysis.report.perfetto.step_segments``: the analysis' own
  compute, communication and wait sets of each rank, moved by the report's applied clock
  offsets), up to ``MAX_RANKS_FROM_TRACES`` ranks; the arrows then come from the matched
  collectives' last arrivers. Either way the browser gets segments, never the event table.
  With the report's table, the step's critical path (``critical_path.parquet``, on the same
  axis: µs from the step's earliest start; the path through the replayed dependency graph)
  is drawn over the lanes as one line.

Segments are kept per run and step (``_CACHE``) while the report is unchanged.
"""
from __future__ import annotations

import threading

import pandas as pd
import plotly.graph_objects as go

from ..sections import Facts, Figure, Link, Note, Section, missing
from .common import COLOURS, PageContext, lanes_layout, pick_step, rank_label

MAX_ARROWS = 24
# Without the report's own timeline table the page reads the traces again; beyond this many
# ranks that would take minutes, so the page asks for a re-analysis instead.
MAX_RANKS_FROM_TRACES = 64
_CACHE: dict[tuple, tuple[pd.DataFrame, list, dict]] = {}
_LOCK = threading.Lock()


def _from_report(ctx: PageContext, step: int):
    """The report's own aligned segments (``timeline.parquet``, schema 2): (segments, arrows);
    None when the report has no such table."""
    tab = ctx.report.table("timeline")
    if tab is None or not {"rank", "step", "kind", "start_us", "end_us"} <= set(tab.columns):
        return None
    seg = tab[tab["step"] == step]
    dim = seg["dim"].fillna("") if "dim" in seg else pd.Series("", index=seg.index)
    kind = seg["kind"].where(~((seg["kind"] == "comm") & (dim != "")), "comm " + dim)
    out = pd.DataFrame({"rank": seg["rank"].astype(int), "kind": kind,
                        "start_us": seg["start_us"], "end_us": seg["end_us"]})
    arrows = []
    if "cause" in seg:
        waits = seg[(seg["kind"] == "wait") & (seg["cause"] >= 0)
                    & (seg["cause"] != seg["rank"])]
        waits = waits.assign(_len=waits["end_us"] - waits["start_us"]).nlargest(
            MAX_ARROWS, "_len")
        arrows = [(int(w.rank), int(w.cause), float(w.start_us), float(w.end_us))
                  for w in waits.itertuples()]
    return out, arrows


def _segments(ctx: PageContext, step: int):
    """(segments, arrows, offsets applied): the report's timeline table where it has one,
    else the segments rebuilt from the traces with the report's offsets."""
    from meshscope.analysis.report.perfetto import aligned_instances, load_aligned, \
        step_segments

    key = (ctx.run_id, ctx.report.mtime_ns, step)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    offsets = ctx.report.table("clock_offsets")
    applied = dict(zip(offsets["rank"].astype(int), offsets["applied_us"])) \
        if offsets is not None and "applied_us" in offsets else {}
    own = _from_report(ctx, step)
    if own is not None:
        out = (own[0], own[1], applied)
    elif len(ctx.report.ranks) > MAX_RANKS_FROM_TRACES:
        return None
    else:
        run = load_aligned(ctx.report.entry.path, ctx.report.entry.report_dir)
        seg = step_segments(run, step)
        out = (seg, _wait_arrows(run, aligned_instances(run), step, seg), dict(run.applied_us))
    with _LOCK:
        if len(_CACHE) > 32:
            _CACHE.clear()
        _CACHE[key] = out
    return out


def _wait_arrows(run, inst: pd.DataFrame, step: int, seg: pd.DataFrame) -> list:
    """(waiting rank, last rank, from µs, to µs) of the step's longest waits, on the same axis
    as ``seg``; [] without matched collectives."""
    coll = run.collectives
    if coll is None or inst.empty or seg.empty or not {"match_id", "last_rank"} <= set(
            coll.columns) or "step" not in inst:
        return []
    inst = inst[inst["step"] == step]
    last = dict(zip(coll["match_id"], coll["last_rank"]))
    t0 = None
    windows = {}
    for r, tr in run.traces.items():
        hit = tr.events[tr.events["name"] == f"ProfilerStep#{step}"]
        if not hit.empty:
            windows[r] = float(hit["ts_us"].min()) - run.applied_us.get(r, 0.0)
    if not windows:
        return []
    t0 = min(windows.values())
    arrows = []
    for mid, g in inst.groupby("match_id"):
        lr = last.get(mid)
        if lr is None or lr != lr:
            continue
        lr = int(lr)
        arrive = g.set_index("rank")["arrival_us"]
        if lr not in arrive:
            continue
        for r, a in arrive.items():
            if int(r) != lr and arrive[lr] > a:
                arrows.append((int(r), lr, a - t0, arrive[lr] - t0))
    arrows.sort(key=lambda x: x[2] - x[3])
    return arrows[:MAX_ARROWS]


def timeline_figure(ctx: PageContext, seg: pd.DataFrame, arrows: list, step: int) -> go.Figure:
    ranks = sorted(seg["rank"].unique())
    label = {r: rank_label(int(r), ctx.report) for r in ranks}
    order = [label[r] for r in ranks]
    fig = go.Figure()
    kinds = ["compute"] + sorted(k for k in seg["kind"].unique() if k.startswith("comm")) + \
        ["wait", "bubble"]
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
    if cp is not None and {"step", "rank", "start_us", "end_us"} <= set(cp.columns) and \
            ctx.report.table("timeline") is not None:
        cp = cp[(cp["step"] == step) & cp["rank"].isin(list(label))].sort_values(
            "order" if "order" in cp else "start_us")
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
    if ctx.state.rank in label:    # ?rank=R: that rank's lane marked across the figure
        i = order[::-1].index(label[ctx.state.rank])   # the y axis lists order reversed
        fig.add_shape(type="rect", xref="paper", x0=0, x1=1, yref="y", y0=i - 0.5, y1=i + 0.5,
                      fillcolor="rgba(255, 200, 0, 0.25)", line={"width": 0}, layer="below")
    lanes_layout(fig, f"Step {step} on the aligned clock",
                 "ms from the earliest rank's step start", order, 34)
    return fig


def sections(ctx: PageContext) -> list[Section]:
    step = pick_step(ctx.report, ctx.state.step)
    export = Link("perfetto-download", "the merged, aligned timeline as a Chrome/Perfetto "
                  "trace", "/export/perfetto" + ctx.state.query(rank=None, step=None,
                                                                  color=None),
                  before="Download ")
    if step is None:
        return [Section("Timeline", [Note("timeline-none", "This report has no profiled "
                                                           "steps."), export])]
    try:
        seg, arrows, applied = _segments(ctx, step) or (None, [], {})
    except (ValueError, OSError) as e:  # InputError is a ValueError
        import logging
        logging.getLogger("meshscope.dashboard").warning("timeline of %s: %s", ctx.run_id, e)
        return [Section("Timeline", [Note("timeline-none", "This run's traces cannot be read "
                                          "any more (the server log says why)."), export])]
    if seg is None:
        return [Section("Timeline", [missing("timeline-none", "aligned timeline table "
                                             "(timeline.parquet)", ctx.run_id), export])]
    if seg.empty:
        return [Section("Timeline", [Note("timeline-none", f"No trace holds step {step}."),
                                     export])]
    moved = {r: a for r, a in applied.items() if a}
    items = [Figure("timeline-graph", timeline_figure(ctx, seg, arrows, step),
                    "Arrows run from the last rank to reach a collective to each rank that "
                    "waited for it." if arrows else None),
             Facts("clock-applied", [("clocks moved", ", ".join(
                 f"rank {r} by {a / 1e3:.3f} ms" for r, a in sorted(moved.items())) or
                 "none (every offset within its uncertainty)")]), export]
    return [Section(f"Step {step}", items)]
