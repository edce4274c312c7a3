"""Communication: how much of it compute hides, how fast the collectives ran against what the
fabric can do, how much of their time was transfer and how much waiting, and who talks to whom.

- ``overlap-table``: each rank's communication, the part hidden behind compute and the overlap
  percentage (HTA's definition), over the profiled steps (summary ``per_rank_mean``, what
  ``meshscope analyze`` prints) and over the whole trace (``trace_overlap``).
- ``busbw-graph``: busbw against message size per op and dimension (log axes), from
  ``bandwidth_summary.parquet`` (medians per size bucket, nccl-tests' definitions,
  analysis/comm/bandwidth.py), with the baseline busbw (``meshscope bench-comm`` or
  nccl-tests) dashed where the report has one.
- ``transfer-wait-graph``: per (dimension, op, group), the time spent transferring and the time
  spent waiting for the other ranks (``bandwidth.parquet``: ``transfer_us``, ``wait_us``),
  summed over the group's ranks and the profiled steps.
- ``rank-matrix-graph``: rank × rank, the bytes and the time of the operations each pair of
  ranks took part in together (a send/recv counts for its two ranks, a collective for every
  pair of its group).
- ``costly-table``: the costliest collectives (longest time on their slowest rank).

Of many ranks (``common.many_ranks``) the sections are tabs (``communication-tabs``: overlap
and bandwidth, transfer vs wait, rank × rank, costliest collectives), a tab's figures drawn
when it is opened (the three figures drawn one after the other took 2–3 s in the browser at
1,024 ranks, docs/benchmarks.md).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..sections import Figure, Note, Section, Table, as_tabs, ms
from .common import (COLOURS, LAYOUT, MANY_RANKS, TOP_K, absent, many_ranks, PageContext,
                     rank_label, top_ranks)

TOP = 12
_NO_TRANSFER = ("No collective of this run has a measurable transfer (none at all, or only "
                "operations whose transfer the trace cannot tell from the wait): no bus "
                "bandwidth to show.")


def busbw_figure(ctx: PageContext) -> go.Figure | None:
    bw = ctx.report.table("bandwidth_summary")
    if bw.empty:
        return None
    fig = go.Figure()
    for (d, op), g in bw.assign(dim=bw["dim"].astype("string").fillna("")).groupby(["dim", "op"], sort=True):
        g = g.sort_values("msg_bytes")
        if not g["busbw_gbps"].notna().any():
            continue        # no transfer time told apart from waiting: no point, no legend
        fig.add_scatter(name=f"{op} ({d})", x=g["msg_bytes"].tolist(),
                        y=g["busbw_gbps"].round(4).tolist(), mode="lines+markers",
                        customdata=g["instances"].tolist(),
                        hovertemplate=f"{op} {d}<br>%{{x:.3s}}B: %{{y:.3f}} GB/s busbw"
                                      "<br>%{customdata} instances<extra></extra>")
        if g["baseline_busbw_gbps"].notna().any():
            b = g[g["baseline_busbw_gbps"].notna()]
            fig.add_scatter(name=f"{op} baseline", x=b["msg_bytes"].tolist(),
                            y=b["baseline_busbw_gbps"].round(4).tolist(), mode="lines",
                            line={"dash": "dash"},
                            hovertemplate=f"{op} baseline %{{x:.3s}}B: %{{y:.3f}} GB/s"
                                          "<extra></extra>")
    fig.update_layout(**LAYOUT, height=420, title="Bus bandwidth vs message size (median per "
                                                  "size bucket)",
                      # decades only: minor log ticks ("2 3 … 9 100k 2 3") read as noise
                      xaxis={"type": "log", "title": "message size (bytes)", "dtick": 1,
                             "tickformat": "~s"},
                      yaxis={"type": "log", "title": "busbw (GB/s)", "dtick": 1,
                             "tickformat": "~g"})
    return fig


def unknown_busbw(ctx: PageContext) -> list[str]:
    """``"send (pp)"``… : the (op, dim) whose every size bucket has no busbw."""
    bw = ctx.report.table("bandwidth_summary")
    if bw.empty:
        return []
    known = bw.assign(dim=bw["dim"].astype("string").fillna(""), known=bw["busbw_gbps"].notna()).groupby(
        ["dim", "op"])["known"]
    return [f"{op} ({d})" for (d, op), k in known.any().items() if not k]


def _per_rank_ops(ctx: PageContext) -> pd.DataFrame | None:
    """One row per operation of one rank with dim, op, group ranks (``group``), bytes,
    duration, transfer and wait: the report's bandwidth table (an older report's own name for
    the group's ranks is mapped in ``reader.read_table``)."""
    bw = ctx.report.table("bandwidth")
    if bw.empty:
        return None
    return bw.rename(columns={"pg_ranks": "group"})


def transfer_wait_figure(ops: pd.DataFrame) -> go.Figure | None:
    if ops["transfer_us"].isna().all() and ops["wait_us"].isna().all():
        return None
    g = ops.assign(dim=ops["dim"].astype("string").fillna("")).groupby(["dim", "op", "group"], sort=True)[
        ["transfer_us", "wait_us"]].sum().reset_index()
    g = g.sort_values("transfer_us", key=lambda s: -(s + g["wait_us"])).head(3 * TOP)
    x = [f"{r.dim} {r.op} [{r.group}]" for r in g.itertuples()]
    fig = go.Figure()
    # Transfer in the communication colour, waiting in the timeline's "wait" colour: one
    # colour per meaning on every page (common.COLOURS).
    fig.add_bar(name="transfer", x=x, y=(g["transfer_us"] / 1e3).round(3).tolist(),
                marker_color=COLOURS["transfer"])
    fig.add_bar(name="wait", x=x, y=(g["wait_us"] / 1e3).round(3).tolist(),
                marker_color=COLOURS["wait"])
    fig.update_layout(**LAYOUT, barmode="stack", height=400, yaxis_title="ms",
                      title="Transfer vs wait per collective kind (summed over ranks and "
                            "profiled steps)", xaxis={"type": "category"})
    return fig


MAX_MATRIX = 128          # cells per side: larger runs are drawn in blocks of ranks


def rank_matrix(ops: pd.DataFrame) -> tuple[list[int], np.ndarray, np.ndarray]:
    """rank × rank bytes and µs of the operations each pair took part in together (from
    each rank's own rows, so the matrix is what each rank saw)."""
    per = ops.assign(msg_bytes=ops["msg_bytes"].astype("float64").fillna(0.0),
                     dur_us=ops["dur_us"].astype("float64").fillna(0.0)) \
        .groupby(["rank", "group"], sort=False)[["msg_bytes", "dur_us"]].sum().reset_index()
    members = {g: [int(x) for x in str(g).split(",") if x.strip().isdigit()]
               for g in per["group"].unique()}
    ranks = sorted(set(per["rank"].astype(int)).union(*map(set, members.values())))
    pos = {r: i for i, r in enumerate(ranks)}
    idx = {g: np.array([pos[m] for m in ms], dtype=int) for g, ms in members.items()}
    nbytes = np.zeros((len(ranks), len(ranks)))
    time_us = np.zeros_like(nbytes)
    for rank, group, b, t in per[["rank", "group", "msg_bytes", "dur_us"]].itertuples(
            index=False):
        i = pos[int(rank)]
        nbytes[i, idx[group]] += b
        time_us[i, idx[group]] += t
    np.fill_diagonal(nbytes, 0.0)   # a rank's own share of its groups is no exchange
    np.fill_diagonal(time_us, 0.0)
    return ranks, nbytes, time_us


MAX_MATRIX_MANY = 64      # … and of many ranks (common.many_ranks): two heatmaps of 128² cells
#                          took a third of a second to draw


def _blocks(ranks: list[int], *mats: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    """Labels and matrices summed over blocks of consecutive ranks, at most ``MAX_MATRIX``
    per side (a 512-rank matrix would send a quarter of a million cells), ``MAX_MATRIX_MANY``
    above ``MANY_RANKS`` ranks."""
    size = -(-len(ranks) // (MAX_MATRIX_MANY if len(ranks) > MANY_RANKS else MAX_MATRIX))
    if size == 1:
        return [f"rank {r}" for r in ranks], list(mats)
    n = -(-len(ranks) // size)
    labels = [f"ranks {ranks[k * size]}–{ranks[min(len(ranks), (k + 1) * size) - 1]}"
              for k in range(n)]
    out = []
    for m in mats:
        pad = np.zeros((n * size, n * size))
        pad[:len(ranks), :len(ranks)] = m
        out.append(pad.reshape(n, size, n, size).sum(axis=(1, 3)))
    return labels, out


def matrix_figure(ops: pd.DataFrame) -> go.Figure:
    ranks, nbytes, time_us = rank_matrix(ops)
    labels, (nbytes, time_us) = _blocks(ranks, nbytes, time_us)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("MB exchanged", "ms spent"),
                        horizontal_spacing=0.12)
    # Of many ranks, numeric axes (a rank block's first rank): a few ticks, where a category
    # label per row and column (4 × 64 of them) was most of the figure's 0.4–1 s to draw
    many = len(ranks) > MANY_RANKS
    size = -(-len(ranks) // len(labels))
    axis = [ranks[k * size] for k in range(len(labels))] if many else labels
    who = ("rank %{y} ↔ rank %{x}" if size == 1 else
           f"ranks %{{y}}… ↔ ranks %{{x}}… ({size} each)") if many else "%{y} ↔ %{x}"
    for col, (z, unit, scale) in enumerate(((nbytes, "MB", 1e6), (time_us, "ms", 1e3)), 1):
        zz = np.where(z > 0, z / scale, np.nan).round(3)
        fig.add_trace(go.Heatmap(z=zz.astype(np.float32), x=axis, y=axis, colorscale="Blues",
                                 colorbar={"title": unit, "x": 0.44 if col == 1 else 1.0,
                                           "len": 0.9},
                                 hovertemplate=who + ": %{z} " + unit + "<extra></extra>",
                                 xgap=1 if len(labels) <= 64 else 0,
                                 ygap=1 if len(labels) <= 64 else 0), row=1, col=col)
    if many:
        fig.update_xaxes(title_text="rank" if size == 1 else f"first rank of {size}")
    layout = {**LAYOUT, "margin": {**LAYOUT["margin"], "t": 90}}   # title above the
    fig.update_layout(**layout, height=min(950, 210 + 22 * len(labels)),   # subplot titles
                      title="Who talks to whom (rows: the rank that saw it"
                            + (", summed over blocks of ranks)" if len(labels) < len(ranks)
                               else ")"))
    fig.update_yaxes(autorange="reversed")
    return fig


def _ms(us) -> str:
    return f"{us / 1e3:.3f} ms" if isinstance(us, (int, float)) and us == us else "—"


def costly_table(ops: pd.DataFrame) -> Table:
    # The keys the table knows (an older report's missing column is all null: not a key).
    keys = [k for k in ("step", "dim", "op", "group", "k") if ops[k].notna().any()]
    agg = {"dur_us": "max", "msg_bytes": "max", "transfer_us": "min", "wait_us": "max"}
    g = ops.groupby(keys, sort=False).agg(agg).reset_index().sort_values(
        "dur_us", ascending=False).head(TOP)
    cols = keys + ["bytes", "slowest rank's time", "transfer", "longest wait"]
    rows = [[r[k] for k in keys] + [f"{int(r['msg_bytes']):,}" if r["msg_bytes"] == r[
        "msg_bytes"] else "—", f"{r['dur_us'] / 1e3:.3f} ms",
        _ms(r["transfer_us"]), _ms(r["wait_us"])] for _, r in g.iterrows()]
    return Table("costly-table", cols, rows, left=len(keys),
                 caption="The collectives that took longest on their slowest rank; the "
                         "transfer is the fastest rank's time (a send/recv's: the time both "
                         "sides' kernels ran together; — where the trace cannot separate it, as "
                         "on gloo), the rest of each rank's time is waiting for the others.")


def overlap_table(ctx: PageContext) -> Table | None:
    """Each rank's communication hidden behind compute (``overlap_pct`` = |M ∩ C| / |M|,
    HTA's definition): over its profiled steps (summary ``per_rank_mean``, the same as
    ``meshscope analyze`` prints) and over the whole trace as HTA's get_comm_comp_overlap
    selects it (``trace_overlap``)."""
    typed = ctx.report.typed
    whole = {t.rank: t.overlap_pct for t in typed.trace_overlap}
    rows = []
    means = typed.per_rank_mean
    shown = None
    if many_ranks(ctx.report) and len(means) > TOP_K:
        # of many ranks: the ranks with the most communication left unhidden, and the
        # focused rank
        shown = set(top_ranks({m.rank: None if m.comm_us is None else
                               m.comm_us - (m.overlapped_comm_us or 0.0) for m in means},
                              focus=ctx.state.rank))
        means = [m for m in means if m.rank in shown]
    for m in means:
        t_pct = whole.get(m.rank)
        rows.append([rank_label(m.rank, ctx.report), ms(m.comm_us), ms(m.overlapped_comm_us),
                     "—" if m.overlap_pct is None else f"{m.overlap_pct:.1f}%",
                     "—" if not isinstance(t_pct, (int, float)) or t_pct != t_pct
                     else f"{t_pct:.1f}%"])
    if not rows:
        return None
    return Table("overlap-table", ["rank", "communication", "hidden behind compute",
                                   "overlap (profiled steps)", "overlap (whole trace, HTA)"],
                 rows, caption="Per step, mean over the profiled steps: the share of "
                               "communication time with compute beside it (HTA's definition). "
                               "The last column is over the whole trace, the events HTA's "
                               "get_comm_comp_overlap reads." +
                               ("" if shown is None else
                                f" The {TOP_K} ranks with the most communication not hidden, "
                                f"of {len(typed.per_rank_mean)}, and the rank the URL "
                                f"focuses on (?rank=)."))


def sections(ctx: PageContext) -> list[Section]:
    out = _sections(ctx)
    if many_ranks(ctx.report):      # a tab per section (module docstring)
        first = [s for s in out if s.title in ("Overlap", "Bandwidth")]
        head = Section(" and ".join(s.title or "" for s in first), [
            i for s in first for i in s.items])
        out = as_tabs([head, *[s for s in out if s not in first]], "communication-tabs")
    return out


def _sections(ctx: PageContext) -> list[Section]:
    out = []
    overlap = overlap_table(ctx)
    if overlap is not None:
        out.append(Section("Overlap", [overlap]))
    bus = busbw_figure(ctx)
    unknown = unknown_busbw(ctx)
    out.append(Section("Bandwidth", [Figure("busbw-graph", bus, "busbw = algbw × the op's bus "
                                            "factor (nccl-tests); n is the group's size."
                                            + (f" No point for {', '.join(unknown)}: the "
                                               "trace cannot tell their transfer from the "
                                               "wait for the peer." if unknown else ""))
                                     if bus else absent(ctx, "bandwidth_summary", "busbw-none",
                                                        "bandwidth summary", _NO_TRANSFER)]))
    ops = _per_rank_ops(ctx)
    if ops is None:
        out.append(Section("Collectives", [absent(ctx, "bandwidth", "ops-none", "bandwidth table",
                                                  "This run has no collective or "
                                                  "point-to-point operation to show.")]))
        return out
    tw = transfer_wait_figure(ops)
    out.append(Section("Transfer vs wait", [Figure("transfer-wait-graph", tw) if tw else
                                            Note("tw-none", "No transfer/wait split.")]))
    out.append(Section("Rank × rank", [Figure("rank-matrix-graph", matrix_figure(ops))]))
    out.append(Section("Costliest collectives", [costly_table(ops)]))
    return out

