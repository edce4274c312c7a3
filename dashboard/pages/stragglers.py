"""Stragglers: which rank holds the others up, by how much, and how sure the analysis is.

- ``straggler-verdict``: the named straggler with its evidence (``cross_rank.straggler``).
- ``heatmap-graph``: rank × step wall time from the step timers — every step, not only the
  profiled ones — warm-up steps marked (not flagged), slow steps flagged
  (``step_heatmap.parquet``); a run of thousands of steps in at most 200 columns, each a run of
  steps showing the rank's longest (``analysis.records.steps.heatmap_columns``).
- ``saving-graph``: the what-if saving of each rank — the step time saved were that rank's
  own work at its reference pace (``cross_rank.rank_savings``, schema 2); beside it
  ``waits-graph``, the wait each rank suffered and caused (``rank_waits.parquet``).
- ``skew-graph``: arrival skew and holdup per matched collective (``collectives.parquet``).
- ``clock-graph``: each rank's clock offset with its uncertainty, and whether it was applied.

Of many ranks (``common.many_ranks``): the saving, waits and clock figures and the clock table
show the ``TOP_K`` ranks with the largest value (|saving|, waited + made wait, |offset|) and
the focused rank, the saving's distribution over every rank beside them
(``saving-distribution``); the heatmap, one cell per rank and step, keeps every rank. Below the
verdict each section is a tab (``stragglers-tabs``: step timers, who holds whom up, arrival
skew, clocks), its figures drawn when it is opened: the six figures of the page, drawn one
after the other, took 2–3.5 s in the browser at 1,024 ranks (docs/benchmarks.md).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from meshscope.analysis.report import reader

from ..sections import (Facts, Figure, Note, Section, Table, as_tabs, clip, evidence_text,
                        ms)
from .common import (COLOURS, LAYOUT, TOP_K, absent, distribution_figure, many_ranks,
                     PageContext, rank_label, rank_ranges, straggler_text, top_ranks)

MAX_SKEW_BARS = 200
MAX_TEXT_CELLS = 2000     # the heatmap's cells that say "slow" in the cell (heatmap_figure)


def _top(ctx: PageContext, values: dict[int, float | None]) -> set[int] | None:
    """Of many ranks, the ranks a per-rank figure shows (``common.top_ranks``); None: all."""
    if not many_ranks(ctx.report) or len(values) <= TOP_K:
        return None
    return set(top_ranks(values, focus=ctx.state.rank))


def _of(shown: set[int] | None, n: int, what: str) -> str:
    return "" if shown is None else f" — the {TOP_K} ranks with the largest {what}, of {n}"


def verdict(ctx: PageContext) -> list:
    cross = ctx.report.typed.cross_rank
    line = straggler_text(ctx.report)
    out = [Note("straggler-verdict", line, warn=True) if line else
           Note("straggler-verdict", "No straggler: no rank's work stands out above the "
                "run's step-to-step noise.")]
    if cross.straggler is not None:
        out.append(Note("straggler-evidence", evidence_text(cross.straggler.evidence)))
    if cross.why_not:
        out.append(Note("crossrank-why-not", "Cross-rank figures were not computed: "
                        + clip("; ".join(cross.why_not), 400), warn=True))
    if cross.noise_us is not None:
        out.append(Facts("noise", [("step-to-step noise", f"{cross.noise_us / 1e3:.2f} ms")]))
    return out


def _flag(col: pd.Series) -> pd.Series:
    """A boolean column of a report table, null read as False."""
    return col.astype("boolean").fillna(False).astype(bool)


def heatmap_figure(ctx: PageContext) -> go.Figure | None:
    """Every step when the run has no more than ``steps.MAX_HEATMAP_COLUMNS``; a longer run's
    steps in runs (``steps.heatmap_columns``), each cell the rank's longest step of its run."""
    hm = ctx.report.table("step_heatmap")
    if hm.empty:
        return None
    warm = set(ctx.report.typed.warmup_steps)
    # An older report's table may lack the flags (read as null): not flagged, not marked.
    hm = hm.assign(warmup=_flag(hm["warmup"]) | hm["step"].isin(warm),
                   profiled=_flag(hm["profiled"]), slow=_flag(hm["slow"]))
    runs = reader.heatmap_runs(hm)
    grid = runs.pivot(index="rank", columns="column", values="wall_time_us")
    cols = runs.drop_duplicates("column").set_index("column").loc[grid.columns]
    profiled = set(ctx.report.steps)
    labels = [(str(a) if a == b else f"{a}–{b}") + (" (warm-up)" if w else "")
              + (" (profiled)" if any(s in profiled for s in range(int(a), int(b) + 1)) else "")
              for a, b, w in zip(cols["first_step"], cols["last_step"], cols["warmup"])]
    slow = (cols["slow"] & ~cols["warmup"]).to_numpy()
    # A slow column says so in each cell; above MAX_TEXT_CELLS cells (each a text the browser
    # lays out: 1,024 ranks took 0.2 s more to draw) in its label instead.
    per_cell = grid.size <= MAX_TEXT_CELLS
    if not per_cell:
        labels = [x + (" (slow)" if s else "") for x, s in zip(labels, slow)]
    # numpy arrays, not nested lists: plotly validates a list cell by cell (a 1,024-rank
    # heatmap spent half a second there)
    text = np.broadcast_to(np.where(slow, "slow", ""), grid.shape) if per_cell else None
    many = len(grid.index) > 64 or len(grid.columns) > 64
    fig = go.Figure(go.Heatmap(
        z=(grid / 1e3).round(2).to_numpy(dtype=np.float32), x=labels,
        y=[rank_label(int(r), ctx.report) for r in grid.index], text=text,
        texttemplate="%{text}" if per_cell and slow.any() else None, colorbar={"title": "ms"},
        # Red only where the analysis found slow steps: no alarm colour without a finding.
        colorscale="YlOrRd" if slow.any() else "Blues",
        hovertemplate="%{y}, step %{x}: %{z:.2f} ms<extra></extra>",
        xgap=0 if many else 1, ygap=0 if many else 1))
    # Profiled columns outlined in black, warm-up ones in a dotted grey: marked, not flagged.
    n = len(grid.index)
    for i, (a, b, w) in enumerate(zip(cols["first_step"], cols["last_step"], cols["warmup"])):
        prof = any(s in profiled for s in range(int(a), int(b) + 1))
        if prof or w:
            fig.add_shape(type="rect", xref="x", yref="y", x0=i - 0.48, x1=i + 0.48,
                          y0=-0.5, y1=n - 0.5, layer="above",
                          line={"color": "#111" if prof else "#888", "width": 2,
                                "dash": "solid" if prof else "dot"})
    binned = bool((cols["first_step"] != cols["last_step"]).any())
    fig.update_layout(**LAYOUT, height=140 + min(26 * len(grid.index), 1200),
                      title="Step time per rank and step (step timers" +
                            ("; a run of steps per column, its longest step" if binned else "")
                            + "); outlined: profiled steps, dotted: warm-up",
                      xaxis={"type": "category", "title": "step"},
                      yaxis={"autorange": "reversed"})
    return fig


def saving_figure(ctx: PageContext) -> go.Figure | None:
    """Each rank's what-if saving, on a scale centred on zero: a negative saving (the step
    gets longer with that rank at its reference pace) is blue below the axis, never alarm red;
    red is kept for the named straggler, grey for savings no finding stands behind."""
    typed = ctx.report.typed
    rows = [r for r in typed.cross_rank.rank_savings if r.saving_us is not None]
    if not rows:
        return None
    named = typed.straggler.rank if typed.straggler is not None else None
    n = len(rows)
    shown = _top(ctx, {r.rank: abs(r.saving_us) for r in rows})
    if shown is not None:
        rows = [r for r in rows if r.rank in shown or r.rank == named]
    ys = [r.saving_us / 1e3 for r in rows]
    colours = [COLOURS["saving negative"] if y < 0 else
               COLOURS["saving straggler"] if r.rank == named else COLOURS["saving"]
               for r, y in zip(rows, ys)]
    fig = go.Figure(go.Bar(x=[rank_label(r.rank, ctx.report) for r in rows], y=ys,
                           marker_color=colours,
                           customdata=[r.reference or "" for r in rows],
                           hovertemplate="%{x}: saves %{y:.2f} ms/step against "
                                         "%{customdata}<extra></extra>"))
    top = max(abs(y) for y in ys) or 1.0
    fig.add_hline(y=0, line_color="#333", line_width=1)
    fig.update_layout(**LAYOUT, height=340, yaxis_title="ms per step (below 0: slower)",
                      yaxis_range=[-1.1 * top, 1.1 * top],
                      title="What-if saving: the step time saved with that rank at its "
                            "reference pace" + _of(shown, n, "|saving|"),
                      xaxis={"type": "category"})
    return fig


def saving_distribution(ctx: PageContext) -> go.Figure | None:
    """Of many ranks: the distribution of every rank's what-if saving."""
    rows = [r for r in ctx.report.typed.cross_rank.rank_savings if r.saving_us is not None]
    if not rows or not many_ranks(ctx.report):
        return None
    return distribution_figure({r.rank: r.saving_us / 1e3 for r in rows},
                               f"What-if saving over all {len(rows)} ranks",
                               "ms per step saved with the rank at its reference pace")


def waits_figure(ctx: PageContext) -> go.Figure | None:
    w = ctx.report.table("rank_waits")
    if w.empty:
        return None
    w = w.sort_values("rank")
    n = len(w)
    shown = _top(ctx, {int(r): float(np.nansum([a, b])) for r, a, b in
                       zip(w["rank"], w["wait_us"], w["wait_caused_us"])})
    if shown is not None:
        w = w[w["rank"].isin(shown)]
    x = [rank_label(int(r), ctx.report) for r in w["rank"]]
    fig = go.Figure()
    for col, name, colour in (("wait_us", "waited", COLOURS["wait"]),
                              ("wait_caused_us", "made others wait", "#F58518")):
        if w[col].notna().any():
            fig.add_bar(name=name, x=x, y=(w[col] / 1e3).round(3).tolist(),
                        marker_color=colour)
    if not fig.data:
        return None
    fig.update_layout(**LAYOUT, barmode="group", height=320, yaxis_title="ms",
                      title="Waiting per rank" + _of(shown, n, "waits suffered and caused"),
                      xaxis={"type": "category"})
    return fig


def skew_figure(ctx: PageContext) -> go.Figure | None:
    c = ctx.report.table("collectives")
    if c.empty or c["skew_us"].isna().all():
        return None
    c = c.sort_values("skew_us", ascending=False).head(MAX_SKEW_BARS)
    label = [f"step {s} · {op} [{_group(g)}] #{k}" for s, op, g, k in
             zip(c["step"], c["op"], c["pg_ranks"], c["k"])]
    last = c["last_rank"].notna().any()
    hidden = len(label) > 40        # no tick labels: the bars' order, the label on hover
    x = list(range(1, len(label) + 1)) if hidden else label
    who = [[name, "" if pd.isna(r) else f"<br>last: rank {int(r)}"]
           for name, r in zip(label, c["last_rank"] if last else [None] * len(label))]
    fig = go.Figure()
    fig.add_bar(name="arrival skew", x=x, y=(c["skew_us"] / 1e3).round(3).tolist(),
                marker_color="#F58518", customdata=who,
                hovertemplate="%{customdata[0]}<br>skew %{y:.3f} ms%{customdata[1]}"
                              "<extra></extra>")
    if c["holdup_us"].notna().any():
        fig.add_bar(name="holdup (last rank alone)", x=x,
                    y=(c["holdup_us"] / 1e3).round(3).tolist(), marker_color="#E45756",
                    customdata=who,
                    hovertemplate="%{customdata[0]}<br>holdup %{y:.3f} ms<extra></extra>")
    fig.update_layout(**LAYOUT, barmode="group", height=380, yaxis_title="ms",
                      title="Arrival skew per matched collective (largest first)",
                      xaxis={"type": "category", "showticklabels": not hidden})
    return fig


def _group(ranks) -> str:
    """A collective's group as its ranks' runs (``0–511``), not 512 numbers in every bar's
    label."""
    members = [int(x) for x in str(ranks).split(",") if x.strip().isdigit()]
    return rank_ranges(members) if members else str(ranks)


def clock_section(ctx: PageContext) -> list:
    offsets = [c for c in reader.clock_offsets(ctx.report.table("clock_offsets"))
               if c.offset_us is not None]
    if not offsets:
        return [absent(ctx, "clock_offsets", "clock-none", "clock-offset table",
                       _why_unmatched(ctx, "clocks"))]
    n = len(offsets)
    shown = _top(ctx, {c.rank: abs(c.offset_us) for c in offsets})
    if shown is not None:
        offsets = [c for c in offsets if c.rank in shown]
    x = [rank_label(c.rank, ctx.report) for c in offsets]
    known = any(c.uncertainty_us is not None for c in offsets)
    err = [None if c.uncertainty_us is None else round(c.uncertainty_us / 1e3, 4)
           for c in offsets] if known else None
    fig = go.Figure(go.Bar(x=x, y=[round(c.offset_us / 1e3, 4) for c in offsets],
                           error_y={"type": "data", "array": err, "visible": True}
                           if err else None, marker_color="#72B7B2"))
    fig.update_layout(**LAYOUT, height=300, yaxis_title="ms", xaxis={"type": "category"},
                      title="Clock offset per rank (± uncertainty)" +
                            _of(shown, n, "|offset|"))
    rows = [[rank_label(c.rank, ctx.report), f"{c.offset_us / 1e3:.3f} ms",
             ms(c.uncertainty_us, 3), f"{c.applied_us / 1e3:.3f} ms", c.source or ""]
            for c in offsets]
    return [Figure("clock-graph", fig), Table("clock-table", ["rank", "offset", "uncertainty",
                                                              "applied", "from"], rows,
                                              caption="An offset is applied (subtracted "
                                                      "from that rank's times) when it "
                                                      "exceeds twice its uncertainty." +
                                              ("" if shown is None else
                                               " The ranks of the figure above; the rank "
                                               "picker's rank (?rank=) is always among "
                                               "them."))]


def _why_unmatched(ctx: PageContext, what: str) -> str:
    """Why this run has no cross-rank figure (``what``): one rank has nobody to compare with;
    otherwise its collectives could not be matched across ranks (the analysis says why)."""
    typed = ctx.report.typed
    if len(typed.ranks) <= 1:
        return f"A single-rank trace has no stragglers to find: no {what} across ranks."
    why = "; ".join(typed.cross_rank.why_not)
    return f"The collectives could not be matched across the ranks: no {what}" + \
        (f" ({why})." if why else ".")


def sections(ctx: PageContext) -> list[Section]:
    out = [Section(None, verdict(ctx))]
    hm = heatmap_figure(ctx)
    out.append(Section("Step timers", [Figure("heatmap-graph", hm) if hm else
                                       absent(ctx, "step_heatmap", "heatmap-none", "step heatmap",
                                              "No step timers in this run (steps/): no rank × "
                                              "step heatmap, no step-to-step noise.")]))
    saving, waits = saving_figure(ctx), waits_figure(ctx)
    spread = saving_distribution(ctx)
    items = ([Figure("saving-distribution", spread)] if spread is not None else []) + [
        Figure("saving-graph", saving) if saving else
        absent(ctx, "rank_waits", "saving-none", "what-if saving per rank",
               _why_unmatched(ctx, "what-if savings"))]
    if waits:
        items.append(Figure("waits-graph", waits))
    out.append(Section("Who holds whom up", items))
    skew = skew_figure(ctx)
    out.append(Section("Arrival skew", [Figure("skew-graph", skew) if skew else
                                        Note("skew-none", "No matched collectives to measure "
                                             "arrival skew on.")]))
    out.append(Section("Clocks", clock_section(ctx)))
    if many_ranks(ctx.report):      # one section at a time: a tab each (module docstring)
        out[1:] = as_tabs(out[1:], "stragglers-tabs")
    return out
