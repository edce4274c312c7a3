"""Pipeline: the microbatch schedule of one step as it ran, the bubble against the replay and the
theory, and stage imbalance.

- ``gantt-graph``: per-stage (and rank) Gantt of step ``?step=`` from ``microbatches.parquet``
  — forward / backward / weight-grad coloured, bubbles the gaps, times from the pipeline
  window's start.
- ``critical-table``: per rank, its work, transfers and waits on the step's critical path
  (``critical_path.parquet``, schema 2; the timeline page draws the path itself, on the step's
  own time axis).
- ``bubble-table`` / ``bubble-graph``: per stage, the measured bubble, the replayed one (the
  schedule alone with the measured durations, analysis/pipeline/schedule.py) and the theory
  (summary.json ``pipeline_stages``).
- ``imbalance-table``: compute per microbatch of each stage against the mean.
- ``phases-table``: warm-up / steady / cool-down of each rank in the step.

Of many ranks (``common.many_ranks``) the Gantt and the phases table show one pipeline
(``pipeline_ranks``): the pp group of the focused rank (``?rank=``, the rank picker), else the
one holding the rank whose work ends last in the step; the title says which, of how many.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from meshscope.analysis.report import reader
from meshscope.analysis.report.reader import Stage

from ..sections import Facts, Figure, Note, Section, Table, fmt, ms
from .common import (COLOURS, LAYOUT, absent, lanes_layout, many_ranks, PageContext, pick_step,
                     rank_label)

PHASES = ("forward", "backward", "weight-grad")


def _critical_path(ctx: PageContext, step: int) -> pd.DataFrame | None:
    cp = ctx.report.table("critical_path")
    cp = cp[(cp["step"] == step) | cp["step"].isna()]    # no step: an older report's one path
    return cp if not cp.empty else None


def pipeline_ranks(ctx: PageContext, step: int) -> tuple[list[int], int] | None:
    """Of many ranks: (the ranks of the pipeline shown, how many pipelines there are) — the
    pp group of the focused rank, else of the rank whose microbatches end last in ``step``;
    None when every rank is shown (few ranks, or no pp groups in run.json)."""
    info = ctx.report.run_info
    if not many_ranks(ctx.report) or info is None:
        return None
    groups = [g for g in info.groups_along("pp") if g.size > 1]
    if not groups:
        return None
    rank = ctx.state.rank
    if rank is None or not any(rank in g.ranks for g in groups):
        mb = ctx.report.table("microbatches")
        mb = mb[mb["step"] == step]
        if mb.empty:
            return None
        rank = int(mb.loc[mb["end_us"].idxmax(), "rank"])
    mine = next((g for g in groups if rank in g.ranks), None)
    return (sorted(int(r) for r in mine.ranks), len(groups)) if mine is not None else None


def gantt_figure(ctx: PageContext, step: int) -> go.Figure | None:
    mb = ctx.report.table("microbatches")
    mb = mb[mb["step"] == step]
    one = pipeline_ranks(ctx, step)
    title = f"Microbatch schedule of step {step}"
    if one is not None:
        mb = mb[mb["rank"].isin(one[0])]
        title += f" — one pipeline of {one[1]}: ranks {', '.join(map(str, one[0]))}"
    if mb.empty:
        return None
    # One lane per rank, named by its pipeline stage — the smallest of its (virtual) stages,
    # as the bubble table counts stages; an interleaved rank's virtual stages follow.
    virtual = mb.groupby("rank")["stage"].agg(lambda s: sorted(set(int(x) for x in s)))
    ranks = sorted(virtual.index, key=lambda r: (virtual[r][0], int(r)))
    labels = {int(r): f"stage {virtual[r][0]}"
              + (f" (virtual {', '.join(map(str, virtual[r]))})" if len(virtual[r]) > 1 else "")
              + f" · {rank_label(int(r), ctx.report)}" for r in ranks}
    order = [labels[int(r)] for r in ranks]
    fig = go.Figure()
    for phase in PHASES + tuple(sorted(set(mb["phase"]) - set(PHASES))):
        g = mb[mb["phase"] == phase]
        if g.empty:
            continue
        chunk = g["chunk"].fillna(0)      # an older report's table has no chunk: 0
        fig.add_bar(name=phase, orientation="h", y=[labels[int(r)] for r in g["rank"]],
                    base=(g["start_us"] / 1e3).round(3).tolist(),
                    x=((g["end_us"] - g["start_us"]) / 1e3).round(3).tolist(),
                    text=[f"{int(m)}" for m in g["mb"]], textposition="inside",
                    insidetextanchor="middle", marker_color=COLOURS.get(phase, "#888"),
                    customdata=list(zip(g["mb"].astype(int), chunk.astype(int))),
                    hovertemplate=f"{phase} mb %{{customdata[0]}} chunk %{{customdata[1]}}"
                                  "<br>%{base:.2f} → %{x:.2f} ms long<extra></extra>")
    lanes_layout(fig, title, "ms from the pipeline window's start", order, 38)
    return fig


def critical_table(ctx: PageContext, step: int) -> list:
    """Per rank, the time of the step's critical path that is its work, a transfer or a wait
    (``critical_path.parquet``: the path through the replayed dependency graph)."""
    cp = _critical_path(ctx, step)
    if cp is None or cp["dur_us"].isna().all():
        return []
    total = float(cp["dur_us"].sum())
    g = cp.pivot_table(index="rank", columns="kind", values="dur_us", aggfunc="sum",
                       fill_value=0.0)
    kinds = [k for k in ("work", "transfer", "wait") if k in g.columns] + \
        [k for k in g.columns if k not in ("work", "transfer", "wait")]
    rows = [[rank_label(int(r), ctx.report)] + [f"{g.loc[r, k] / 1e3:.2f} ms" for k in kinds]
            + [f"{100 * g.loc[r].sum() / total:.0f} %" if total > 0 else "—"]
            for r in g.index]
    return [Table("critical-table", ["rank"] + kinds + ["share of the path"], rows,
                  caption=f"The critical path of step {step} ({total / 1e3:.2f} ms, through "
                          "the replayed dependency graph): whose work, transfers and waits "
                          "make the step as long as it is. The timeline page draws it.")]


def bubble_rows(ctx: PageContext) -> list[Stage]:
    return ctx.report.typed.pipeline_stages


def bubble_table(rows: list[Stage]) -> Table:
    body = []
    for s in rows:
        meas, theory, rep = s.bubble_fraction, s.theory_fraction, s.replayed_bubble_fraction
        ratio = meas / theory if meas is not None and theory else None
        body.append([s.stage, ", ".join(map(str, s.ranks)),
                     fmt(None if meas is None else 100 * meas, 1, " %"),
                     fmt(None if rep is None else 100 * rep, 1, " %"),
                     fmt(None if theory is None else 100 * theory, 1, " %"),
                     "—" if ratio is None else f"{ratio:.2f}×"])
    return Table("bubble-table", ["stage", "ranks", "measured bubble", "replayed", "theory",
                                  "measured / theory"], body, left=2,
                 caption="Measured: the stage's idle share of the pipeline window, mean over "
                         "its ranks and the profiled steps. Replayed: the schedule alone with "
                         "the measured durations and free transfers. Theory: the schedule's "
                         "closed form, e.g. (p−1)/(m+p−1) for 1F1B.")


def bubble_figure(rows: list[Stage]) -> go.Figure:
    fig = go.Figure()
    x = [f"stage {s.stage}" for s in rows]
    for key, name, colour in (("bubble_fraction", "measured", "#E45756"),
                              ("replayed_bubble_fraction", "replayed", "#F2CF5B"),
                              ("theory_fraction", "theory", "#4C78A8")):
        ys = [None if getattr(s, key) is None else 100 * getattr(s, key) for s in rows]
        if any(y is not None for y in ys):
            fig.add_bar(name=name, x=x, y=ys, marker_color=colour,
                        hovertemplate=f"%{{x}} {name}: %{{y:.1f}}%<extra></extra>")
    fig.update_layout(**LAYOUT, barmode="group", height=320, yaxis_title="% of the window",
                      title="Bubble per stage: measured, replayed, theory")
    return fig


def imbalance(ctx: PageContext) -> list:
    """Stage imbalance, two measures each under its own name (the summary's):
    measured — each stage's compute per microbatch against the stages' mean, the table below
    (``stage_imbalance.parquet``) — and replayed with the straggler at its peers' pace (the
    stage-imbalance finding's measure, ``crossrank/whatif.py``)."""
    tab = ctx.report.table("stage_imbalance")
    typed = ctx.report.typed
    measured, corrected = typed.stage_imbalance_measured, typed.stage_imbalance_without_straggler
    out = []
    facts = []
    if measured:
        facts += [("max / mean, measured (compute per microbatch, table below)",
                   f"{measured.max_over_mean:.3f} (stage {measured.slowest_stage})")]
    if corrected:
        facts += [("max / mean with the straggler at its peers' pace (replayed)",
                   f"{corrected.max_over_mean:.3f} (stage {corrected.slowest_stage})")]
    if facts:
        out.append(Facts("imbalance-facts", facts))
    stages = reader.stage_computes(tab)
    if stages:
        out.append(Table("imbalance-table", ["stage", "compute per microbatch", "× mean"],
                         [[s.stage, ms(s.compute_per_mb_us), fmt(s.ratio_to_mean, 3)]
                          for s in stages]))
    return out or [absent(ctx, "stage_imbalance", "imbalance-none", "stage-imbalance table")]


def phases(ctx: PageContext, step: int) -> list:
    tab = ctx.report.table("pipeline_phases")
    tab = tab[tab["step"] == step].sort_values("rank")
    one = pipeline_ranks(ctx, step)
    if one is not None:      # of many ranks: the pipeline the Gantt shows
        tab = tab[tab["rank"].isin(one[0])]
    if tab.empty:
        return []
    cols = [c for c in ("warmup_us", "steady_us", "cooldown_us") if tab[c].notna().any()]
    return [Table("phases-table", ["rank"] + [c[:-3].replace("warmup", "warm-up")
                                              .replace("cooldown", "cool-down")
                                              for c in cols],
                  [[rank_label(int(r["rank"]), ctx.report)] + [ms(r[c]) for c in cols]
                   for _, r in tab.iterrows()],
                  caption=f"The schedule's phases in step {step}, as each rank saw them"
                          + (" (the ranks of the pipeline drawn above)." if one else "."))]


def sections(ctx: PageContext) -> list[Section]:
    rows = bubble_rows(ctx)
    pp = ctx.report.run_info.size("pp") if ctx.report.run_info is not None else None
    if not rows and not (isinstance(pp, int) and pp > 1):
        return [Section("Pipeline", [Note("pipeline-none", "No pipeline parallelism in this "
                                          "run: no schedule, no bubble to compare with "
                                          "theory.")])]
    step = pick_step(ctx.report, ctx.state.step)
    gantt = gantt_figure(ctx, step) if step is not None else None
    out = [Section(f"Schedule of step {step}", [
        Figure("gantt-graph", gantt, "Each bar is one microbatch's forward, backward or "
               "weight-grad on one rank; the gaps are the bubble.") if gantt else
        absent(ctx, "microbatches", "gantt-none", "microbatch table for this step")])]
    out.append(Section("Bubble vs theory", [bubble_table(rows), Figure("bubble-graph",
                                                                       bubble_figure(rows))]
                       if rows else [absent(ctx, "bubbles", "bubble-none", "bubble table")]))
    out.append(Section("Stage imbalance", imbalance(ctx)))
    crit = critical_table(ctx, step) if step is not None else []
    if crit:
        out.append(Section(f"Critical path of step {step}", crit))
    ph = phases(ctx, step) if step is not None else []
    if ph:
        out.append(Section("Warm-up, steady, cool-down", ph))
    return out
