"""GPU: where the device's idle time goes, what its steps were made of, which kernels ran, how
fast the matrix multiplications went and which synchronisations left it idle — the report's GPU
tables (docs/metrics.md), shown as they were written.

- ``gpu-headline``: the mean idle per step against the step — the run's profiled window,
  summary.json's ``window_us`` (one GPU rank: that rank's own window, ``per_rank_mean``) —
  and its largest cause.
- ``idle-graph``: one horizontal stacked bar per rank: its idle time per step (mean over the
  profiled steps of ``idle.parquet``), split by cause — data loader, synchronisation, waiting
  for another rank, launching, other host work, queued, nothing traced. The parts add up to
  the breakdown's idle.
- The rest is about one rank (``?rank=``, else the first): ``categories-graph``, each
  profiled step in the former TensorBoard plugin's categories (``step_categories.parquet``);
  ``kernels-table``, the top kernels (``kernels.parquet``), long names cut with the full name
  as the cell's tooltip, and ``kernel-categories-table`` (``kernel_categories.parquet``);
  ``gemms-table``, achieved TFLOP/s against the device's peak (``gemms.parquet``, when the
  trace records shapes); ``sync-table``, the synchronisations grouped by op, parent op and
  call site (``sync_calls.parquet``); ``stream-idle-table``, HTA's idle breakdown per stream
  (``stream_idle.parquet``).

A run without GPU activity (the CPU runs) gets the one note ``gpu-none``.

Of many ranks (``common.many_ranks``) the headline stays above and each section is a tab
(``gpu-tabs``: the idle's distribution and its top ranks by cause, step categories, kernels,
GEMMs, synchronisations, idle per stream), its figures drawn when it is opened: the three
figures and five tables of the 64-GPU-rank page, drawn together, took 1.8–2.3 s in the
browser (docs/benchmarks.md).
"""
from __future__ import annotations

import dataclasses
import json
import re

import pandas as pd
import plotly.graph_objects as go

from meshscope.analysis.report import reader

from ..data import RunReport
from ..sections import Cell, Figure, Link, Note, Section, Table, as_tabs, fmt
from .common import (LAYOUT, TOP_K, absent, distribution_figure, many_ranks, PageContext,
                     rank_label, top_ranks)

# idle.parquet's causes, in the order the analysis charges them, in words.
IDLE_CAUSES = {
    "dataloader": "data loader",
    "sync": "synchronisation (.item(), cudaStreamSynchronize…)",
    "wait_rank": "waiting for another rank",
    "startup": "start-up (CUDA initialisation, streams, modules, allocation)",
    "launch": "launching (CUDA runtime calls)",
    "cpu": "other host work (operators, Python)",
    "queued": "queued: launched, not yet running",
    "other": "nothing traced on the host",
}
IDLE_COLOURS = {"dataloader": "#F58518", "sync": "#B279A2", "wait_rank": "#E45756",
                "startup": "#9D755D", "launch": "#72B7B2", "cpu": "#54A24B", "queued": "#EECA3B",
                "other": "#BAB0AC"}
# step_categories.parquet's categories (the plugin's names), in its priority order.
# The plugin's "Communication" is its own category (a communication kernel running with no
# compute kernel), not the overview's exposed communication (the breakdown's M \ C \ B): it is
# named as a category, drawn hatched in a colour no "exposed"/"comm" bar uses, and the page
# says both numbers where they differ (``category_note``).
STEP_CATEGORIES = {"kernel": "Kernel", "memcpy": "Memcpy", "memset": "Memset",
                   "communication": "Communication (category)", "runtime": "Runtime",
                   "dataloader": "DataLoader", "cpu_exec": "CPU Exec", "other": "Other"}
CATEGORY_COLOURS = {"kernel": "#4C78A8", "memcpy": "#9D755D", "memset": "#D8B5A5",
                    "communication": "#F4A582", "runtime": "#72B7B2",
                    "dataloader": "#F58518", "cpu_exec": "#54A24B", "other": "#BAB0AC"}
CATEGORY_PATTERNS = {"communication": "/"}
NAME_CHARS = 70          # kernel names and call sites longer than this are cut
# Namespaces a cut kernel name can do without (the tooltip keeps the whole name).
NAMESPACES = re.compile(r"at::native::|at::detail::|c10::|\(anonymous namespace\)::")
MAX_SYNC_ROWS = 30
MAX_GEMM_ROWS = 30


def is_gpu(report: RunReport) -> bool:
    """Whether the report is of a run with GPU activity (its GPU tables have rows, or
    summary.json says so)."""
    if report.typed.device == "gpu":
        return True
    return any(len(report.table(name)) for name in ("idle", "kernels"))


def cut(name: str, limit: int = NAME_CHARS) -> str:
    """``name`` in at most ``limit`` characters, cut cleanly: a C++ kernel name loses its
    ``void``, PyTorch's namespaces and its argument list first, then is cut after a separator (``, `` ``::`` ``<``
    space) with an ellipsis."""
    name = " ".join(str(name).split())
    if len(name) <= limit:
        return name
    short = NAMESPACES.sub("", re.sub(r"^void\s+", "", name))
    angle = paren = 0
    for i, ch in enumerate(short):      # the argument list: the first '(' outside <…> and (…)
        if ch == "(" and angle == 0 and paren == 0 and i > 0:
            short = short[:i]
            break
        angle += (ch == "<") - (ch == ">")
        paren += (ch == "(") - (ch == ")")
    if len(short) <= limit:
        return short + ("(…)" if short != name and len(short) + 3 <= limit else "")
    head = short[:limit - 1]
    for seps in ((", ", "<", "(", " ", "/"), ("::", ".", "_")):
        stop = max(head.rfind(s) + len(s) for s in seps)
        if stop > limit // 2:
            return head[:stop].rstrip(" ,") + "…"
    return head + "…"


def _cell(name) -> Cell | str:
    name = "" if name is None or (isinstance(name, float) and name != name) else str(name)
    short = cut(name)
    return Cell(short, name) if short != name else name


def shapes_text(shapes) -> Cell | str:
    """``gemms.parquet``'s ``shapes`` (JSON text of the inputs' dims) as ``32×2048 · 2048×1000``:
    the non-empty inputs' dims (a bias too); the JSON as the tooltip."""
    try:
        dims = json.loads(shapes)
        text = " · ".join("×".join(str(int(d)) for d in s) for s in dims
                          if isinstance(s, list) and s)
    except (TypeError, ValueError):
        return _cell(shapes)
    return Cell(text, str(shapes)) if text else _cell(shapes)


def focus_rank(ctx: PageContext) -> int | None:
    """The rank the per-rank sections show: ``?rank=`` when the report has it, else the
    first."""
    ranks = ctx.report.ranks
    if ctx.state.rank is not None and ctx.state.rank in ranks:
        return ctx.state.rank
    return ranks[0] if ranks else None


# ---- where the idle time goes ------------------------------------------------------------

def idle_means(report: RunReport) -> pd.DataFrame:
    """The summary's ``gpu_idle_per_rank_mean`` (idle per step, mean over the profiled steps)
    as a frame indexed by rank: ``idle_us`` — the idle total, the breakdown's
    (``per_rank_mean``), which the causes add up to — and each ``idle_<cause>_us`` the report
    wrote, in the reader's order; empty when the report has none."""
    rows = report.typed.gpu_idle_per_rank_mean
    if not rows:
        return pd.DataFrame()
    total = {m.rank: m.idle_us for m in report.typed.per_rank_mean}
    return pd.DataFrame([{"rank": r.rank, "idle_us": total.get(r.rank),
                          **{f"idle_{c}_us": v for c, v in r.by_cause_us.items()}}
                         for r in rows]).set_index("rank").astype(float).sort_index()


def _causes(means: pd.DataFrame) -> list[str]:
    return [c[5:-3] for c in means.columns if c.startswith("idle_") and c != "idle_us"]


def idle_figure(report: RunReport, height_per_rank: int = 34, title: bool = True,
                focus: int | None = None) -> go.Figure | None:
    """One horizontal bar per rank: its mean idle per step, stacked by cause (ms). Of many
    ranks (``common.many_ranks``), the ``TOP_K`` with the most idle and ``focus``."""
    means = idle_means(report)
    if means.empty:
        return None
    heading = "GPU idle time per rank by cause (mean per profiled step)"
    if many_ranks(report) and len(means) > TOP_K:
        shown = top_ranks(means["idle_us"].to_dict(), focus=focus)
        heading = f"GPU idle by cause of the {TOP_K} ranks with the most idle, of " \
                  f"{len(means)}" + (f", and rank {focus}" if focus in shown and
                                     focus not in top_ranks(means["idle_us"].to_dict())
                                     else "") + " (mean per profiled step)"
        means = means.loc[shown]
    labels = [rank_label(r, report) for r in means.index]
    idle_ms = (means["idle_us"] / 1e3).tolist()
    fig = go.Figure()
    for cause in _causes(means):
        ys = (means[f"idle_{cause}_us"] / 1e3).round(4).tolist()
        name = IDLE_CAUSES.get(cause, cause.replace("_", " "))
        share = [100 * v / t if t else 0.0 for v, t in zip(ys, idle_ms)]
        fig.add_bar(name=name, y=labels, x=ys, orientation="h",
                    marker_color=IDLE_COLOURS.get(cause, "#79706E"),
                    text=ys, texttemplate="%{x:.1f}", textposition="inside",
                    insidetextanchor="middle",
                    customdata=[[int(r), s] for r, s in zip(means.index, share)],
                    hovertemplate=f"%{{y}}<br>{name}: %{{x:.2f}} ms per step "
                                  f"(%{{customdata[1]:.0f}}% of the idle)<extra></extra>")
    n = len(labels)
    row = max(12, min(height_per_rank, 900 // max(n, 1)))
    fig.update_layout(**{**LAYOUT, "margin": {"l": 90, "r": 20, "t": 40 if title else 30,
                                              "b": 50}},
                      barmode="stack", height=150 + row * n + (30 if title else 0),
                      uniformtext={"minsize": 10, "mode": "hide"},
                      title=heading if title else None,
                      xaxis_title="ms of GPU idle per step",
                      yaxis={"type": "category", "autorange": "reversed"},
                      legend={"orientation": "h", "y": -0.5 if n < 3 else -0.15,
                              "yanchor": "top", "traceorder": "normal"})
    if n < 3:   # a legend below a short figure needs room of its own
        fig.update_layout(height=fig.layout.height + 60, margin_b=110,
                          legend={"y": -0.35 - 0.1 * (3 - n)})
    return fig


def idle_distribution(report: RunReport) -> go.Figure | None:
    """Of many ranks: the distribution of every rank's mean GPU idle per step."""
    means = idle_means(report)
    if means.empty or not many_ranks(report):
        return None
    return distribution_figure((means["idle_us"] / 1e3).to_dict(),
                               f"GPU idle per step over all {len(means)} ranks",
                               "ms of GPU idle per step (mean over the profiled steps)")


def headline(report: RunReport) -> Note | None:
    """The mean idle per step against the step, and its largest cause, in one sentence."""
    means = idle_means(report)
    if means.empty:
        return None
    idle_ms = means["idle_us"].mean() / 1e3
    # The run's step window: the report's one (summary window_us, the longest rank's per step,
    # as the overview and analyze show it). With one GPU rank the sentence is that rank's own,
    # so its own window (its breakdown's mean; the same number when it is the report's only
    # rank).
    own = [r.window_us for r in report.typed.per_rank_mean if r.rank == means.index[0]]
    window_us = own[0] if len(means) == 1 and own else report.typed.step_time.window_us
    window = window_us / 1e3 if window_us is not None else None
    causes = {c: means[f"idle_{c}_us"].mean() / 1e3 for c in _causes(means)}
    top = max(causes, key=causes.get) if causes else None
    n = len(report.steps)
    over = f"mean over the {n} profiled steps" if n > 1 else "in the profiled step"
    if len(means) == 1:
        text = f"Rank {means.index[0]}'s GPU idles {idle_ms:.1f} ms"
        text += f" of its {window:.1f} ms step ({100 * idle_ms / window:.0f}%)" if window \
            else " per step"
    else:
        text = f"The GPUs idle {idle_ms:.1f} ms"
        text += f" of their {window:.1f} ms step ({100 * idle_ms / window:.0f}%)" if window \
            else " per step"
        over = f"mean over the {len(means)} ranks and " + over.replace("mean over ", "")
    text += f", {over}"
    if top and causes[top] > 0 and idle_ms > 0:
        text += (f"; the largest part: {IDLE_CAUSES.get(top, top)}, {causes[top]:.1f} ms "
                 f"({100 * causes[top] / idle_ms:.0f}% of the idle)")
    if len(means) > 1:
        lo, hi = means["idle_us"].idxmin(), means["idle_us"].idxmax()
        text += (f"; from {means.loc[lo, 'idle_us'] / 1e3:.1f} ms on rank {lo} to "
                 f"{means.loc[hi, 'idle_us'] / 1e3:.1f} ms on rank {hi}")
    return Note("gpu-headline", text + ".")


IDLE_CAPTION = ("Each stretch of GPU idle is charged to what the host thread that launched "
                "the next work was doing (docs/metrics.md): in the data loader, in a blocking "
                "synchronisation, in a collective's host call (waiting for another rank), in "
                "a runtime call (launching), in other operators or Python, or nothing traced; "
                "'queued' is work already launched but not yet running. The parts add up to "
                "the idle of the overview's step breakdown.")


def overview_section(ctx: PageContext) -> Section | None:
    """The overview's "Where the GPU's idle time goes" (GPU runs only): the headline, the
    idle bars and a link to this page."""
    rep = ctx.report
    if not is_gpu(rep):
        return None
    fig = idle_figure(rep, height_per_rank=26, title=many_ranks(rep), focus=ctx.state.rank)
    line = headline(rep)
    items = [line] if line else []
    spread = idle_distribution(rep)
    if spread is not None:
        items.append(Figure("overview-idle-distribution", spread))
    items.append(Figure("overview-idle-graph", fig) if fig is not None else
                 absent(ctx, "idle", "overview-idle-none", "GPU idle breakdown"))
    items.append(Link("gpu-link", "the GPU page", ctx.state.href("gpu", color=None),
                      before="Step categories, kernels, GEMMs and synchronisations: "))
    return Section("Where the GPU's idle time goes", items, id="overview-gpu")


# ---- one rank: step categories, kernels, GEMMs, synchronisations -------------------------

def categories_figure(report: RunReport, rank: int) -> go.Figure | None:
    cats = report.table("step_categories")
    mine = cats[cats["rank"] == rank].sort_values("step")
    if mine.empty:
        return None
    x = [f"step {s}" for s in mine["step"]]
    fig = go.Figure()
    for key, label in STEP_CATEGORIES.items():
        col = f"{key}_us"
        if mine[col].isna().all():      # a category an older report did not write
            continue
        fig.add_bar(name=label, x=x, y=(mine[col] / 1e3).round(4).tolist(),
                    marker_color=CATEGORY_COLOURS[key],
                    marker_pattern_shape=CATEGORY_PATTERNS.get(key, ""),
                    hovertemplate=f"%{{x}}<br>{label}: %{{y:.2f}} ms<extra></extra>")
    fig.update_layout(**LAYOUT, barmode="stack", height=400,
                      title=f"Each profiled step of {rank_label(rank, report)} in the "
                            f"TensorBoard plugin's categories",
                      yaxis_title="ms per step", xaxis={"type": "category"},
                      legend={"traceorder": "reversed"})
    return fig


def category_note(report: RunReport, rank: int) -> Note | None:
    """Where the plugin's Communication category and the breakdown's exposed communication of
    ``rank`` differ in a profiled step (by more than 1 µs): one sentence giving both, each
    named by what it measures — two quantities (docs/metrics.md), never one number drawn
    twice. None where they agree or either is missing."""
    cats = report.table("step_categories")
    bd = report.table("breakdown")
    both = cats[cats["rank"] == rank][["step", "communication_us"]].merge(
        bd[bd["rank"] == rank][["step", "exposed_comm_us"]], on="step")
    both = both.dropna()
    differ = both[(both["communication_us"] - both["exposed_comm_us"]).abs() > 1.0]
    if differ.empty:
        return None
    r = differ.iloc[0]
    more = f" (and in {len(differ) - 1} other profiled step{'s' if len(differ) > 2 else ''})" \
        if len(differ) > 1 else ""
    return Note("categories-vs-exposed",
                f"Two different quantities: Communication (category) here is the TensorBoard "
                f"plugin's — time a communication kernel runs while no compute kernel, copy "
                f"or memset does, in the plugin's step window — "
                f"{r['communication_us'] / 1e3:.2f} ms in step {int(r['step'])}{more}; the "
                f"overview's exposed communication is the step breakdown's — communication "
                f"that neither compute nor the pipeline bubble hides, in the breakdown's "
                f"step window — {r['exposed_comm_us'] / 1e3:.2f} ms in that step "
                f"(docs/metrics.md).")


def kernels_table(report: RunReport, rank: int) -> Table | Note | None:
    if not report.has_table("kernels"):
        return None
    mine = [k for k in reader.kernels(report.table("kernels")) if k.rank == rank]
    if not mine:
        return Note("kernels-none", f"No kernel ran on rank {rank} in the profiled steps.")
    graph = any(k.graph for k in mine)
    rows = []
    for k in mine:
        row = [_cell(k.name), k.category or "", k.count, f"{k.total_us / 1e3:.2f}",
               fmt(k.mean_us, 1), fmt(k.share_pct, 1)]
        if graph:
            row.append("yes" if k.graph else "")
        rows.append(row)
    n = len(report.steps)
    return Table("kernels-table", ["kernel", "category", "count", "total ms", "mean µs",
                                   "share %"] + (["CUDA graph"] if graph else []), rows,
                 caption=f"The kernels with the most GPU time on rank {rank}, over the "
                         f"{n} profiled step{'s' if n != 1 else ''}; total: summed over those "
                         f"steps; share: of the rank's device time in them. "
                         f"Hover a cut name for the whole of it.", left=2)


def kernel_categories_table(report: RunReport, rank: int) -> Table | None:
    kc = report.table("kernel_categories")
    mine = kc[kc["rank"] == rank].sort_values("total_us", ascending=False)
    if mine.empty:
        return None
    total = mine["total_us"].sum()
    rows = [[r["category"], int(r["count"]), f"{r['total_us'] / 1e3:.2f}",
             fmt(100 * r["total_us"] / total if total else None, 1)]
            for _, r in mine.iterrows()]
    return Table("kernel-categories-table", ["category", "kernels", "total ms", "share %"],
                 rows, caption="Every kernel of the rank by category (by name: GEMM, "
                               "attention, convolution…), over the profiled steps.")


def gemms_table(report: RunReport, rank: int) -> Table | Note | None:
    if not report.has_table("gemms"):
        return None
    mine = [g for g in reader.gemms(report.table("gemms")) if g.rank == rank]
    if not mine:
        return Note("gemms-none", "No matrix multiplication with its shapes in this trace: "
                                  "profile with record_shapes=True to see the achieved "
                                  "TFLOP/s of each against the device's peak.")
    rows = []
    for g in sorted(mine, key=lambda g: -g.flops)[:MAX_GEMM_ROWS]:
        rows.append([g.op, shapes_text(g.shapes), g.dtype or "—", g.calls,
                     f"{g.flops / 1e9:.2f}", f"{g.kernel_us / 1e3:.3f}", fmt(g.tflops, 1),
                     fmt(g.peak_tflops, 1),
                     "—" if g.efficiency is None else f"{100 * g.efficiency:.1f}"])
    return Table("gemms-table", ["op", "shapes", "dtype", "calls", "GFLOP", "kernel ms",
                                 "achieved TFLOP/s", "peak TFLOP/s", "efficiency %"], rows,
                 caption="Matrix multiplications grouped by operator, input shapes (a bias "
                         "first for addmm) and type: "
                         "achieved = FLOPs (2·M·N·K) over the time of the kernels they "
                         "launched; peak: the device's dense peak for that type (— when the "
                         "trace does not name the device or the type)."
                 + (f" The {MAX_GEMM_ROWS} with the most FLOPs of {len(mine)} are shown."
                    if len(mine) > MAX_GEMM_ROWS else ""), left=3)


def sync_table(report: RunReport, rank: int) -> Table | Note | None:
    if not report.has_table("sync_calls"):
        return None
    calls = report.table("sync_calls")
    mine = calls[calls["rank"] == rank]
    mine = mine[~(mine["step"] < 0)]    # an older report's null step: the whole trace
    if mine.empty:
        return Note("sync-none", f"No blocking synchronisation on rank {rank} in the profiled "
                                 f"steps.")
    keys = ["name", "parent_op", "call_site"]
    grouped = (mine.assign(dur_us=mine["end_us"] - mine["ts_us"],
                           **{k: mine[k].fillna("—").astype(str) for k in keys})
               .groupby(keys, sort=False)
               .agg(count=("dur_us", "size"), total_us=("dur_us", "sum"),
                    idle_us=("idle_after_us", "sum"))
               .reset_index()
               .sort_values(["idle_us", "total_us"], ascending=False))
    rows = [[r["name"], r["parent_op"], _cell(r["call_site"]), int(r["count"]),
             f"{r['total_us'] / 1e3:.3f}", f"{r['idle_us'] / 1e3:.2f}"]
            for _, r in grouped.head(MAX_SYNC_ROWS).iterrows()]
    more = f" The {MAX_SYNC_ROWS} of {len(grouped)} that left the most idle are shown." \
        if len(grouped) > MAX_SYNC_ROWS else ""
    return Table("sync-table", ["synchronisation", "parent op", "call site", "count",
                                "total ms", "GPU idle after, ms"], rows,
                 caption="Every blocking synchronisation of the profiled steps on this rank, "
                         "grouped by "
                         "the call, the operator it was called from (aten::item for a "
                         ".item()) and its Python frame (— when the trace has no stacks: "
                         "with_stack=True). total: time in the calls; idle after: the GPU "
                         "idle charged to them (the synchronisation cause)." + more, left=3)


def stream_idle_table(report: RunReport, rank: int | None = None) -> Table | None:
    """HTA's idle breakdown per stream, of ``rank`` (the page's rank picker) when given."""
    table = report.table("stream_idle")
    if rank is not None:
        table = table[table["rank"] == rank]
    streams = reader.stream_idle(table)
    if not streams:
        return None
    rows = [[s.rank, s.stream] + [fmt(None if v is None else v / 1e3, 2) for v in
                                  (s.idle_us, s.host_wait_us, s.kernel_wait_us, s.other_us)]
            for s in streams]
    return Table("stream-idle-table", ["rank", "stream", "idle ms", "host wait ms",
                                       "kernel wait ms", "other ms"], rows,
                 caption="HTA's idle time breakdown, per stream over the trace: the gaps "
                         "between one stream's kernels, as host wait (the next launch came "
                         "late), kernel wait (a short gap) and other — for comparison with "
                         "HTA's get_idle_time_breakdown.", left=2)


def sections(ctx: PageContext) -> list[Section]:
    rep = ctx.report
    if not is_gpu(rep):
        return [Section(None, [Note("gpu-none", "This page shows GPU figures — where the "
                                    "device's idle time goes, its kernels, GEMMs and "
                                    "synchronisations — and this run has none: its traces "
                                    "hold no GPU activity (device: "
                                    f"{rep.typed.device or 'unknown'}).")])]
    out = []
    line = headline(rep)
    rank = focus_rank(ctx)
    fig = idle_figure(rep, focus=ctx.state.rank)
    spread = idle_distribution(rep)
    out.append(Section("Where the GPU's idle time goes",
                       ([line] if line else []) +
                       ([Figure("idle-distribution", spread)] if spread is not None else []) +
                       [Figure("idle-graph", fig, IDLE_CAPTION) if fig is not None else
                        absent(ctx, "idle", "idle-none", "GPU idle breakdown (idle.parquet)")]))
    if rank is None:
        return out
    who = rank_label(rank, rep)
    cats = categories_figure(rep, rank)
    differ = category_note(rep, rank)
    out.append(Section(f"Step categories · {who}", [
        Figure("categories-graph", cats, "The former TensorBoard profiler plugin's split of "
               "each step: Kernel where a compute kernel runs, else Memcpy, Memset, "
               "Communication (the plugin's category: a communication kernel and no compute "
               "kernel; hatched), Runtime (the host in a CUDA runtime call), DataLoader, CPU "
               "Exec, Other; the parts add up to the step's device window.")
        if cats is not None else absent(ctx, "step_categories", "categories-none",
                                        "step categories table")] +
        ([differ] if differ is not None and cats is not None else [])))
    kt = kernels_table(rep, rank)
    kc = kernel_categories_table(rep, rank)
    out.append(Section(f"Kernels · {who}", [
        kt if kt is not None else absent(ctx, "kernels", "kernels-missing", "kernel table")]
        + ([kc] if kc is not None else [])))
    gt = gemms_table(rep, rank)
    out.append(Section(f"GEMM efficiency · {who}", [
        gt if gt is not None else absent(ctx, "gemms", "gemms-missing", "GEMM table")]))
    st_ = sync_table(rep, rank)
    out.append(Section(f"Synchronisations · {who}", [
        st_ if st_ is not None else absent(ctx, "sync_calls", "sync-missing",
                                           "synchronisation table")]))
    si = stream_idle_table(rep, rank)
    if si is not None:
        out.append(Section(f"Idle per stream (HTA's breakdown) · {who}", [si]))
    if many_ranks(rep):     # the headline above; each section a tab, drawn when opened
        first = out[0]
        head = [i for i in first.items if isinstance(i, Note)]
        rest = [i for i in first.items if not isinstance(i, Note)]
        out = [Section(None, head)] + as_tabs(
            [dataclasses.replace(first, items=rest), *out[1:]], "gpu-tabs")
    return out
