"""Overview: what the run was, where each rank's step went, where the slow rank sits in the mesh,
and the ranked findings with their evidence, cost and remedy.

- ``run-facts``: layout, world size, schedule, microbatches, step time, tokens/s, MFU.
- ``lead-finding``: the run's first finding, whatever its kind, at the head of the page.
- ``straggler``: the named straggler and what fixing it saves (``cross_rank.straggler``), or
  why there is none (the run's noise, a single rank, no trace).
- ``mesh-graph``: the layout drawn as its mesh — one row per pipeline stage, one column per
  (dp, cp, tp) coordinate — each rank coloured by ``?color=``: its what-if saving (default,
  when the report has one), or a part of its step breakdown; expert-parallel groups named in
  each cell.
- ``breakdown-graph``: per-rank stacked bars of summary.json's ``per_rank_mean`` (compute,
  overlapped comm, exposed comm per dimension, bubble, other, idle; they add up to the step
  window, analysis/timeline/breakdown.py). Of many ranks (``common.many_ranks``): the bars of
  the ``TOP_K`` ranks with the longest step window (and the focused rank), beside
  ``step-distribution``, the distribution of every rank's step window.
- Of many ranks the mesh keeps its grid of dimensions, each pipeline stage's (dp, cp, tp)
  columns folded into a block of rows ``MESH_WIDTH`` wide (``_fold``), the cells without
  text (the hover names each rank and its coordinates).
- ``overview-gpu`` (runs with GPU activity): where the GPU's idle time goes — one sentence,
  the per-rank idle bars by cause (``overview-idle-graph``, ``idle.parquet``) and a link to the
  GPU page (``pages/device.py``).
- Of many ranks the mesh, the step breakdown and the GPU's idle are tabs (``overview-tabs``),
  each tab's figures drawn when it is opened (docs/benchmarks.md: the 64- and 1,024-rank
  overviews drew their three figures in 1.9–2.3 s on the shared machine); the findings follow.
- ``findings-table``: the findings in the order the analysis ranked them, each with a link
  to the page, rank and step that show its evidence (its first citation with a page,
  ``Finding.cites``; in the static report that place as text); the lead finding has the same
  link (``lead-finding-evidence``).
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from meshscope.analysis.report.model import human_bytes
from meshscope.analysis.report import reader

from ..sections import (Facts, Figure, Link, Note, Section, Table, as_tabs, clip,
                        evidence_cell, evidence_text, fmt, place_text, shown_at)
from . import device
from .common import (COLOURS, DIMS, LAYOUT, TOP_K, PageContext, absent, distribution_figure,
                     finding_title, many_ranks, rank_label, straggler_text, top_ranks)

# Mesh colourings: key -> (label, where the value comes from).
COLOR_CHOICES = {"saving": "what-if saving (ms/step)", "compute": "compute (ms/step)",
                 "exposed": "exposed comm (ms/step)", "bubble": "bubble (ms/step)",
                 "idle": "idle (ms/step)", "wait": "wait caused (ms)"}


def header_facts(ctx: PageContext) -> Facts:
    """What the run was (from summary.json, through the typed reader)."""
    rep = ctx.report
    typed = rep.typed
    st = typed.step_time
    facts = [("layout", typed.run_fact("layout_str")),
             ("world size", typed.run_fact("world_size")),
             ("schedule", typed.run_fact("schedule")),
             ("microbatches", typed.run_fact("microbatches")),
             ("model", typed.model_preset), ("status", typed.status),
             ("profiled steps", ", ".join(map(str, typed.steps)) or None),
             ("device", typed.device),
             ("step time", st.text() if st.us is not None else None)]
    also = [f"{name} {v / 1e3:.2f} ms" for name, v in
            (("replayed", st.replayed_us), ("profiled window", st.window_us))
            if v is not None and name != st.short]
    if also:
        facts.append(("other step times", ", ".join(also)))
    # tokens/s and MFU come from the step timers: the reader gives them only beside the
    # timer's step time.
    if typed.tokens_per_s is not None:
        facts.append(("tokens/s", f"{typed.tokens_per_s:,.0f}"))
    if typed.mfu_pct is not None:
        facts.append(("MFU", f"{typed.mfu_pct:.1f}%"))
    if not typed.run:
        facts.append(("source", "a plain folder of traces (no run.json)" if typed.ranks else
                      "Flight Recorder dumps alone (no run.json, no trace)"))
    return Facts("run-facts", [(k, v) for k, v in facts if v not in (None, "")])


def input_warnings(ctx: PageContext) -> list:
    typed = ctx.report.typed
    out = []
    if typed.missing_ranks:
        out.append(Note("missing-ranks", "Missing ranks (no usable trace): "
                        + ", ".join(map(str, typed.missing_ranks)), warn=True))
    if typed.problems:
        out.append(Note("problems", f"{len(typed.problems)} input problem(s) — see the Health "
                        "page: " + clip(typed.problems[0], 200), warn=True))
    return out


def metric(ctx: PageContext, key: str) -> dict[int, float]:
    """rank -> value (ms) of the mesh colouring ``key``; {} when the report lacks it."""
    cross = ctx.report.typed.cross_rank
    if key == "saving":
        return {r: v / 1e3 for r, v in cross.saving_of().items()}
    if key == "wait":
        return {r: v / 1e3 for r, v in cross.wait_caused_of().items()}
    field = {"compute": "compute_us", "exposed": "exposed_comm_us", "bubble": "bubble_us",
             "idle": "idle_us"}[key]
    return {r.rank: getattr(r, field) / 1e3 for r in ctx.report.typed.per_rank_mean
            if getattr(r, field) is not None}


def color_key(ctx: PageContext) -> str:
    if ctx.state.color in COLOR_CHOICES and metric(ctx, ctx.state.color):
        return ctx.state.color
    for key in ("saving", "wait", "exposed", "idle"):   # the first that is not all zero
        if any(metric(ctx, key).values()):
            return key
    return "compute"


MESH_WIDTH = 32          # columns of a folded mesh row
MESH_TEXT_CELLS = 256    # above this many cells, the values are on hover only


def _fold(rows: list, cols: list) -> tuple[int, int]:
    """(blocks per stage, columns per block row): a stage with more than ``MESH_WIDTH``
    columns is folded into rows of ``MESH_WIDTH`` (one row: no fold)."""
    if len(cols) <= MESH_WIDTH:
        return 1, len(cols)
    return -(-len(cols) // MESH_WIDTH), MESH_WIDTH


def mesh_figure(ctx: PageContext) -> go.Figure | None:
    """The mesh as a grid: rows pp stages, columns the (dp, cp, tp) coordinates in that order;
    None when there is nothing to colour."""
    rep = ctx.report
    key = color_key(ctx)
    values = metric(ctx, key)
    if not values:
        return None
    info = rep.run_info
    ranks = sorted(set(rep.ranks) | set(values))
    coords = {r: (info.coordinates.get(r) or {}) if info else {} for r in ranks}
    ep_of = {}
    if info is not None:
        for i, g in enumerate(info.groups_along("ep")):
            if g.size > 1:
                for r in g.ranks:
                    ep_of.setdefault(r, i)
    if all(coords.values()):
        row_of = {r: coords[r].get("pp", 0) for r in ranks}
        col_key = {r: tuple(coords[r].get(d, 0) for d in ("dp", "cp", "tp")) for r in ranks}
        col_dims = [d for d in ("dp", "cp", "tp") if info and info.size(d) > 1]
    else:  # a folder of traces: one row of ranks
        row_of = {r: 0 for r in ranks}
        col_key = {r: (r,) for r in ranks}
        col_dims = []
    rows = sorted(set(row_of.values()))
    cols = sorted(set(col_key.values()))
    row_i = {v: i for i, v in enumerate(rows)}
    col_i = {v: j for j, v in enumerate(cols)}
    fold, width = _fold(rows, cols)
    z = [[None] * width for _ in range(len(rows) * fold)]
    text = [[""] * width for _ in range(len(rows) * fold)]
    hover = [[""] * width for _ in range(len(rows) * fold)]
    who = [[None] * width for _ in range(len(rows) * fold)]
    idx = {"dp": 0, "cp": 1, "tp": 2}

    def col_label(c) -> str:
        if col_dims:
            return "·".join(f"{d}{c[idx[d]]}" for d in col_dims)
        return f"rank {c[0]}" if not all(coords.values()) else ""

    for r in ranks:
        j = col_i[col_key[r]]
        i, j = row_i[row_of[r]] * fold + j // width, j % width
        v = values.get(r)
        z[i][j] = v
        who[i][j] = r
        value = "—" if v is None else f"{v:.2f} ms"
        cell = ("▶ " if r == ctx.state.rank else "") + f"rank {r}<br>{value}" + \
            (f"<br>ep group {ep_of[r]}" if r in ep_of else "")
        hover[i][j] = cell + (f"<br>{col_label(col_key[r])}" if fold > 1 else "")
        text[i][j] = cell if len(ranks) <= MESH_TEXT_CELLS else ""
    if fold > 1:    # folded: a row is a stage's block of columns, named by its first and last
        xlabels = [f"+{j}" for j in range(width)]
        ylabels = [f"{'stage ' + str(s) + ' · ' if info and info.size('pp') > 1 else ''}"
                   f"{col_label(cols[b * width])}–"
                   f"{col_label(cols[min(len(cols), (b + 1) * width) - 1])}"
                   for s in rows for b in range(fold)]
    else:
        xlabels = [col_label(c) for c in cols]
        ylabels = [f"stage {s}" if info and info.size("pp") > 1 else "" for s in rows]
    scale, colours = {}, "Blues"
    if key == "saving":
        # Savings diverge around zero (a negative saving: the step gets longer at the reference
        # pace), judged against the step so that a healthy run's few milliseconds of noise stay
        # pale; red only when the analysis names a straggler — no alarm colour without a finding.
        step_us = rep.typed.step_time.us
        top = max([abs(v) for v in values.values() if v is not None] + [0.0])
        lim = max(top, 0.1 * step_us / 1e3) if isinstance(step_us, (int, float)) and \
            step_us > 0 else max(top, 1e-3)
        scale = {"zmin": -lim, "zmax": lim, "zmid": 0.0}
        named = rep.typed.straggler is not None
        colours = "RdBu_r" if named else [[0.0, "#4575b4"], [0.5, "#f7f7f7"],
                                          [1.0, "#7f7f7f"]]
    elif not any(v for v in values.values() if v is not None):
        scale = {"zmin": 0.0, "zmax": 1.0}   # all zero: white, not the middle of the scale
    gap = 3 if len(ranks) <= MESH_TEXT_CELLS else 1
    written = len(ranks) <= MESH_TEXT_CELLS      # else no text at all: none for plotly to lay out
    fig = go.Figure(go.Heatmap(z=z, x=xlabels, y=ylabels, text=text if written else None,
                               texttemplate="%{text}" if written else None,
                               hovertext=hover, hoverinfo="text",
                               customdata=who, colorscale=colours, colorbar={"title": "ms"},
                               xgap=gap, ygap=gap, **scale))
    n_rows = len(rows) * fold
    fig.update_layout(**LAYOUT, title=f"The mesh, coloured by {COLOR_CHOICES[key]}" +
                      (f" ({len(cols)} columns of each stage folded into rows of {width})"
                       if fold > 1 else ""),
                      height=120 + (90 if fold == 1 else 22) * n_rows,
                      yaxis={"autorange": "reversed", "type": "category"},
                      xaxis={"type": "category"})
    if fold > 1:
        fig.update_layout(margin={**LAYOUT["margin"], "l": 190})
    return fig


def _ms4(values_us: list) -> list[float]:
    """µs (None unknown) as ms rounded to 0.1 µs, NaN where unknown; all zero when nothing is
    known (the report has no such part)."""
    if all(v is None for v in values_us):
        return [0.0] * len(values_us)
    return np.round(np.array([np.nan if v is None else v for v in values_us], dtype=float)
                    / 1e3, 4).tolist()


def _segments(rows: list[reader.RankMean]) -> list[tuple[str, list[float]]]:
    """(label, ms per rank) of each stacked segment of the ranks' ``RankMean`` rows; exposed
    comm split by dimension where the report splits it."""
    def part(field: str) -> list[float]:
        return _ms4([getattr(r, field) for r in rows])
    segs = [("compute without overlapped comm", _ms4([r.compute_without_overlap_us
                                                       for r in rows])),
            ("overlapped comm", part("overlapped_comm_us"))]
    shown = [d for d in DIMS if any((r.exposed_by_dim_us.get(d) or 0.0) > 0 for r in rows)]
    if shown:
        segs += [(f"exposed {d}", _ms4([r.exposed_by_dim_us.get(d) for r in rows]))
                 for d in shown]
    else:
        segs.append(("exposed comm", part("exposed_comm_us")))
    segs += [("bubble", part("bubble_us")), ("other", part("other_us")),
             ("idle", part("idle_us"))]
    return segs


def breakdown_figure(ctx: PageContext) -> go.Figure | None:
    rows = sorted(ctx.report.typed.per_rank_mean, key=lambda r: r.rank)
    need = ("window_us", "compute_us", "overlapped_comm_us", "exposed_comm_us", "bubble_us",
            "idle_us")
    if not rows or not all(any(getattr(r, f) is not None for r in rows) for f in need):
        return None
    title = "Step breakdown per rank (mean over profiled steps)"
    if many_ranks(ctx.report) and len(rows) > TOP_K:
        window = {r.rank: r.window_us for r in rows}
        shown = set(top_ranks(window, focus=ctx.state.rank))
        title = f"Step breakdown of the {TOP_K} ranks with the longest step, of {len(rows)}" + \
            (f", and rank {ctx.state.rank}" if ctx.state.rank in shown and
             ctx.state.rank not in top_ranks(window) else "") + " (mean over profiled steps)"
        rows = [r for r in rows if r.rank in shown]
    x = [rank_label(r.rank, ctx.report) for r in rows]
    focus = [2.5 if r.rank == ctx.state.rank else 0 for r in rows]
    fig = go.Figure()
    compute = _ms4([r.compute_us for r in rows])
    for label, ys in _segments(rows):
        # The blue segment is compute minus the part overlapping communication: its hover
        # also names the rank's whole compute, the figure the CLI and summary.json call compute.
        extra = [f"<br>compute (all): {c:.2f} ms" if label.startswith("compute") else ""
                 for c in compute]
        fig.add_bar(name=label, x=x, y=ys, marker_color=COLOURS.get(label, "#E45756"),
                    marker_line={"width": focus, "color": "#111"},
                    customdata=[r.rank for r in rows], hovertext=extra,
                    hovertemplate=f"%{{x}}<br>{label}: %{{y:.2f}} ms%{{hovertext}}"
                                  "<extra></extra>")
    fig.update_layout(**LAYOUT, barmode="stack", height=420, title=title,
                      yaxis_title="ms per step", xaxis={"type": "category"},
                      legend={"traceorder": "reversed"})
    return fig


def step_distribution(ctx: PageContext) -> go.Figure | None:
    """Of many ranks: the distribution of every rank's step window (``per_rank_mean``)."""
    rows = ctx.report.typed.per_rank_mean
    if not many_ranks(ctx.report) or not rows:
        return None
    return distribution_figure({r.rank: None if r.window_us is None else r.window_us / 1e3
                                for r in rows},
                               f"Step window per rank over all {len(rows)} ranks",
                               "ms per step (mean over the profiled steps)")


def findings_table(ctx: PageContext) -> Table | Note:
    found = ctx.report.typed.findings
    if not found:
        return Note("findings-none", "No findings: nothing in this run stands out above "
                                     "its own noise.")
    rows = []
    for i, f in enumerate(found, 1):
        rows.append([i, f.severity, finding_title(f), f.dimension or "",
                     "—" if f.cost_us is None else f"{f.cost_us / 1e3:.2f}",
                     fmt(f.cost_pct, 1),
                     "—" if f.peak_saving_bytes is None else human_bytes(f.peak_saving_bytes),
                     evidence_text(f.evidence), f.remedy,
                     clip("; ".join(map(str, f.symptoms)), 300),
                     evidence_cell(f, ctx.state)])
    return Table("findings-table", ["#", "severity", "finding", "dim", "cost ms/step",
                                    "cost %", "peak saving", "evidence", "remedy", "explains",
                                    "shown on"],
                 rows,
                 caption="Cost: the step time fixing it would save (the analysis' what-if), "
                         "mean per profiled step; cost % is of the headline step time (the "
                         "step timer's, else the profiled window). Peak "
                         "saving: by how much a memory finding's remedy lowers the memory "
                         "peak. The raw numbers of each evidence are in summary.json; the rows "
                         "they come from are its cites, shown on the page named last.",
                 left=11)


def lead_finding(ctx: PageContext) -> list[Note | Link]:
    """The run's first finding, whatever its kind, at the head of the page (the findings
    table below has them all), and where its evidence is shown: a link to that page, rank and
    step (in the static report, the place as text)."""
    found = ctx.report.typed.findings
    if not found:
        return []
    f = found[0]
    cost = "" if f.cost_us is None else \
        f" — costs {f.cost_us / 1e3:.1f} ms/step ({fmt(f.cost_pct, 1)}%)"
    out: list[Note | Link] = [Note("lead-finding", f"First finding: [{f.severity}] {finding_title(f)}"
                                   f"{cost}.", warn=f.severity == "high")]
    c = shown_at(f)
    if c is not None:
        if ctx.state.static:
            out.append(Note("lead-finding-evidence", f"Its evidence: see {place_text(c)}."))
        else:
            out.append(Link("lead-finding-evidence", place_text(c),
                            ctx.state.href(c.page, rank=c.rank, step=c.step),
                            before="Its evidence: "))
    return out


def straggler_note(ctx: PageContext) -> Note:
    """The straggler line: the straggler, or why there is none — its peers' noise, a single
    rank, or no trace at all."""
    rep = ctx.report
    line = straggler_text(rep)
    if line:
        return Note("straggler", line, warn=True)
    if not rep.typed.ranks:
        return Note("straggler", "No trace: stragglers and timings cannot be judged; the "
                                 "findings come from the always-on records (Flight Recorder, "
                                 "step timers).")
    if len(rep.typed.ranks) == 1:
        return Note("straggler", "A single-rank trace has no stragglers to find.")
    return Note("straggler", "No straggler: no rank's work stands out above the run's "
                             "step-to-step noise.")


def sections(ctx: PageContext) -> list[Section]:
    out = [Section(None, [header_facts(ctx), *input_warnings(ctx)], id="overview-head")]
    out.append(Section(None, [*lead_finding(ctx), straggler_note(ctx)]))
    mesh = mesh_figure(ctx)
    bars = breakdown_figure(ctx)
    out.append(Section("Where the ranks sit", [
        Figure("mesh-graph", mesh, "Each cell is one rank at its mesh coordinates; the "
               "colour says how much of the step it costs."
               + ("" if ctx.state.static else " Click a rank (here or in the bars) to focus "
                  "the view on it."))
        if mesh else Note("mesh-none", "No per-rank figures to draw the mesh with.")]))
    spread = step_distribution(ctx)
    out.append(Section("Step breakdown", ([Figure("step-distribution", spread)]
                                          if spread is not None else []) +
                       [Figure("breakdown-graph", bars) if bars else
                        absent(ctx, "breakdown", "breakdown-none", "step breakdown")]))
    gpu = device.overview_section(ctx)
    if gpu is not None:
        out.append(gpu)
    if many_ranks(ctx.report):     # the mesh, the breakdown and the GPU's idle: tabs
        out[2:] = as_tabs(out[2:], "overview-tabs")
    out.append(Section("Findings", [findings_table(ctx)]))
    return out
