"""Memory: where each rank's memory goes, why a layout runs out — the report's memory tables
(docs/memory.md), shown as they were written.

- ``memory-headline``: the largest peak of the run, where it falls, and the stage that holds
  the most (``memory.devices`` / ``memory.stages`` of summary.json).
- ``memory-peaks-graph``: one group of bars per rank — its main device's peak allocated and
  peak reserved over the profiled steps (``memory_devices.parquet``), the device's memory as a
  line where it is known.
- ``memory-findings-table``: the memory findings, as the analysis ranked them, each with a link
  to the page, rank and step that show its evidence (the static report: that place as text).
- About one rank (``?rank=``, else the one with the largest peak): ``memory-curve-graph``,
  allocated and reserved over time (``memory_curve.parquet``: a bounded envelope of every
  memory event, so every peak is drawn at its height), each profiled step a band, the peak
  marked; ``memory-live-table``, the blocks live at its peak grouped by the operator, module
  and range that allocated them (``memory_live.parquet``); ``memory-steps-table``, each
  step's peaks (``memory_steps.parquet``); ``memory-terms-table``, the model states its trace
  shows (``memory_terms.parquet``).
- ``memory-snapshots-table``, ``memory-snapshot-live-table``, ``memory-segments-table``: the
  memory snapshots read (``memory_segments`` / ``memory_snapshot_live.parquet``).

A run recorded without ``profile_memory`` and without a snapshot gets the one note
``memory-none``.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from meshscope.analysis.report.model import human_bytes

from ..data import RunReport
from ..sections import (Cell, Figure, Note, Section, Table, clip, evidence_cell,
                        evidence_text, fmt)
from ..state import ViewState
from .common import LAYOUT, PageContext, finding_title, rank_label

MEMORY_IDS = ("near-oom", "memory-imbalance", "memory-growth", "memory-fragmentation",
              "largest-allocator")
MIB = float(1 << 20)
MAX_SEGMENTS = 30
COLOURS = {"allocated": "#4C78A8", "reserved": "#F58518", "device": "#E45756",
           "band": "rgba(120, 120, 120, 0.12)", "band_alt": "rgba(120, 120, 120, 0.03)"}


def has_memory(report: RunReport) -> bool:
    return bool(len(report.table("memory_devices")) or len(report.table("memory_segments")))


def _mib(b) -> float | None:
    return None if b is None or b != b else round(float(b) / MIB, 3)


def main_devices(report: RunReport) -> pd.DataFrame:
    """One row of ``memory_devices`` per rank: its main device (accelerator before CPU),
    as the summary's reader picks it."""
    dev = report.table("memory_devices")
    if dev.empty:
        return dev
    main = {(d.rank, d.device) for d in report.typed.memory.main()}
    keep = [(int(r), str(d)) in main for r, d in zip(dev["rank"], dev["device"])]
    return dev[keep].sort_values("rank")


def focus_rank(ctx: PageContext) -> int | None:
    """``?rank=`` when the report has memory for it, else the rank with the largest peak."""
    main = main_devices(ctx.report)
    if main.empty:
        return None
    ranks = [int(r) for r in main["rank"]]
    if ctx.state.rank is not None and ctx.state.rank in ranks:
        return ctx.state.rank
    return int(main.sort_values("peak_allocated_bytes", ascending=False)["rank"].iloc[0])


def headline(report: RunReport) -> Note | None:
    mem = report.typed.memory
    main = mem.main()
    if not main:
        return None
    top = max(main, key=lambda d: d.peak_allocated_bytes or 0.0)
    text = (f"The largest peak: rank {top.rank}, {human_bytes(top.peak_allocated_bytes)} "
            f"allocated on {top.device}")
    if top.peak_step is not None:
        text += f" in step {top.peak_step}"
    if top.peak_op:
        text += f", at {top.peak_op}" + (f" in {top.peak_module}" if top.peak_module else "")
    if top.peak_reserved_bytes is not None:
        text += f"; {human_bytes(top.peak_reserved_bytes)} reserved at most"
    if top.device_total_bytes:
        text += f", of the device's {human_bytes(top.device_total_bytes)}"
    if len(mem.stages) > 1:
        s = max(mem.stages, key=lambda s: s.peak_allocated_bytes or 0.0)
        text += (f". Stage {s.stage} holds the most: {human_bytes(s.peak_allocated_bytes)} "
                 f"on rank {s.peak_rank}")
    if any(d.totals == "since-start" for d in main):
        text += (". CPU totals count only what was allocated while the profiler recorded "
                 "(PyTorch's CPU allocator reports nothing older)")
    if any(d.totals == "rebuilt" for d in main):
        text += (". This trace has no allocator totals (PyTorch 1.8): allocated is rebuilt "
                 "from the signed bytes, from 0 at the trace's start")
    return Note("memory-headline", text + ".")


def peaks_figure(report: RunReport) -> go.Figure | None:
    main = main_devices(report)
    if main.empty:
        return None
    labels = [f"{rank_label(r, report)} · {d}" for r, d in zip(main["rank"], main["device"])]
    fig = go.Figure()
    fig.add_bar(name="peak allocated", x=labels,
                y=[_mib(v) for v in main["peak_allocated_bytes"]],
                marker_color=COLOURS["allocated"],
                customdata=[[int(r), s if s == s else -1]
                            for r, s in zip(main["rank"], main["peak_step"])],
                hovertemplate="%{x}<br>peak allocated %{y:.2f} MiB in step %{customdata[1]}"
                              "<extra></extra>")
    if main["peak_reserved_bytes"].notna().any():
        fig.add_bar(name="peak reserved", x=labels,
                    y=[_mib(v) for v in main["peak_reserved_bytes"]],
                    marker_color=COLOURS["reserved"],
                    hovertemplate="%{x}<br>peak reserved %{y:.2f} MiB<extra></extra>")
    if main["device_total_bytes"].notna().any():
        fig.add_scatter(name="device memory", x=labels,
                        y=[_mib(v) for v in main["device_total_bytes"]], mode="markers",
                        marker={"symbol": "line-ew-open", "size": 40,
                                "color": COLOURS["device"], "line": {"width": 3}},
                        hovertemplate="%{x}<br>device memory %{y:.0f} MiB<extra></extra>")
    fig.update_layout(**LAYOUT, barmode="group", height=380,
                      title="Peak memory per rank over the profiled steps (its main device)",
                      yaxis_title="MiB", xaxis={"type": "category"},
                      legend={"orientation": "h", "y": -0.25})
    return fig


def curve_figure(report: RunReport, rank: int) -> go.Figure | None:
    main = main_devices(report)
    row = main[main["rank"] == rank]
    if row.empty:
        return None
    device = str(row["device"].iloc[0])
    cur = report.table("memory_curve")
    cur = cur[(cur["rank"] == rank) & (cur["device"] == device)].sort_values("ts_us")
    if cur.empty:
        return None
    steps = report.table("memory_steps")
    steps = steps[(steps["rank"] == rank) & (steps["device"] == device)].sort_values("step")
    t0 = float(steps["start_us"].min()) if len(steps) else float(cur["ts_us"].min())
    x = ((cur["ts_us"] - t0) / 1e3).round(3).tolist()
    fig = go.Figure()
    fig.add_scatter(name="allocated", x=x, y=[_mib(v) for v in cur["allocated_bytes"]],
                    mode="lines", line={"color": COLOURS["allocated"], "shape": "hv"},
                    hovertemplate="%{x:.2f} ms: %{y:.2f} MiB allocated<extra></extra>")
    if cur["reserved_bytes"].notna().any():
        fig.add_scatter(name="reserved", x=x, y=[_mib(v) for v in cur["reserved_bytes"]],
                        mode="lines", line={"color": COLOURS["reserved"], "shape": "hv"},
                        hovertemplate="%{x:.2f} ms: %{y:.2f} MiB reserved<extra></extra>")
    for i, (_, s) in enumerate(steps.iterrows()):
        # Every other step shaded, each step's start a dotted line: adjacent steps stay apart.
        fig.add_vrect(x0=(s["start_us"] - t0) / 1e3, x1=(s["end_us"] - t0) / 1e3,
                      fillcolor=COLOURS["band"] if i % 2 == 0 else COLOURS["band_alt"],
                      line_width=0, layer="below",
                      annotation_text=f"step {int(s['step'])}", annotation_position="top left")
        fig.add_vline(x=(s["start_us"] - t0) / 1e3, line_width=1, line_dash="dot",
                      line_color="#888")
    peak = row.iloc[0]
    if peak["peak_us"] == peak["peak_us"]:
        fig.add_scatter(name="peak", x=[round((float(peak["peak_us"]) - t0) / 1e3, 3)],
                        y=[_mib(peak["peak_allocated_bytes"])], mode="markers+text",
                        marker={"color": COLOURS["device"], "size": 11, "symbol": "x"},
                        text=[f"peak {human_bytes(peak['peak_allocated_bytes'])}"],
                        textposition="top center",
                        hovertemplate="peak %{y:.2f} MiB<extra></extra>")
    fig.update_layout(**LAYOUT, height=420,
                      title=f"Allocated and reserved over time · {rank_label(rank, report)} "
                            f"· {device}",
                      xaxis_title="ms from the first profiled step's start", yaxis_title="MiB",
                      legend={"orientation": "h", "y": -0.2})
    return fig


def _cell(text, n: int = 60) -> Cell | str:
    text = "" if text is None or text != text else str(text)
    short = clip(text, n)
    return Cell(short, text) if short != text else text


def live_table(report: RunReport, rank: int) -> Table | Note | None:
    live = report.table("memory_live")
    mine = live[live["rank"] == rank]
    if mine.empty:
        return None
    step = int(mine["step"].iloc[0])
    rows = [[_cell(r["operator"]), _cell(r["module"] or "—"), _cell(r["annotation"] or "—"),
             f"{r['bytes'] / MIB:.2f}", "—" if r["blocks"] != r["blocks"] else int(r["blocks"]),
             fmt(None if r["share"] != r["share"] else 100 * r["share"], 1)]
            for _, r in mine.iterrows()]
    return Table("memory-live-table", ["operator", "module", "range", "MiB", "blocks",
                                       "share of the peak %"], rows,
                 caption=f"The blocks live at rank {rank}'s largest peak (step {step}), "
                         f"grouped by the operator that allocated them, the module (with "
                         f"with_modules / with_stack) and the user range (a microbatch's "
                         f"forward, the optimizer's step) it ran in. '(before the trace)': "
                         f"bytes live then that the trace never saw allocated.", left=3)


def steps_table(report: RunReport, rank: int) -> Table | None:
    st = report.table("memory_steps")
    mine = st[st["rank"] == rank].sort_values(["device", "step"])
    if mine.empty:
        return None
    rows = [[r["device"], int(r["step"]), f"{r['peak_allocated_bytes'] / MIB:.2f}",
             _cell(r["peak_allocated_op"] or "—", 40),
             fmt(_mib(r["peak_reserved_bytes"]), 2), fmt(_mib(r["fragmentation_bytes"]), 2),
             f"{r['start_allocated_bytes'] / MIB:.2f}", f"{r['end_allocated_bytes'] / MIB:.2f}",
             int(r["events"])]
            for _, r in mine.iterrows()]
    return Table("memory-steps-table", ["device", "step", "peak allocated MiB", "at",
                                        "peak reserved MiB", "reserved − allocated MiB",
                                        "start MiB", "end MiB", "events"], rows,
                 caption="Each profiled step: the peaks, the operator at the allocated peak, "
                         "reserved − allocated at it (memory the allocator holds that no "
                         "tensor uses), and the allocated total at the step's start and end — "
                         "an end higher every step is a leak.", left=1)


def terms_table(report: RunReport, rank: int) -> Table | None:
    terms = report.table("memory_terms")
    mine = terms[terms["rank"] == rank]
    if mine.empty:
        return None
    rows = [[r["device"], r["term"].replace("_", " "), f"{r['bytes'] / MIB:.3f}", r["source"],
             _cell(r["detail"], 70)] for _, r in mine.iterrows()]
    return Table("memory-terms-table", ["device", "term", "MiB", "source", "how"], rows,
                 caption="The model states this rank's trace shows: from its memory events "
                         "(gradients freed by zero_grad, optimizer state made in the "
                         "optimizer's step and never freed, activations live at the peak) and "
                         "the runner's own count of its storages (census). `meshscope compare "
                         "--detail` sets them beside the planner's.", left=2)


def findings_table(report: RunReport, state: ViewState) -> Table | Note:
    """The memory findings, each with a link to the page, rank and step that show its
    evidence (``sections.evidence_cell``)."""
    found = [f for f in report.typed.findings if f.id in MEMORY_IDS]
    if not found:
        return Note("memory-findings-none", "No memory finding: no device near its memory, "
                    "no growth across steps, no imbalance, fragmentation or single allocator "
                    "above its threshold (docs/memory.md).")
    rows = [[f.severity, finding_title(f), "—" if f.peak_saving_bytes is None else
             human_bytes(f.peak_saving_bytes), evidence_text(f.evidence), f.remedy,
             clip("; ".join(map(str, f.symptoms)), 300), evidence_cell(f, state)]
            for f in found]
    return Table("memory-findings-table", ["severity", "finding", "lowers the peak by",
                                           "evidence", "remedy", "explains", "shown on"],
                 rows, left=7)


def snapshot_sections(report: RunReport) -> list[Section]:
    snaps = report.typed.memory.snapshots
    if not snaps:
        return []
    rows = []
    for s in snaps:
        oom = s.oom
        rows.append([s.source, s.rank, s.device, fmt(_mib(s.reserved_bytes), 2),
                     fmt(_mib(s.allocated_bytes), 2), fmt(_mib(s.free_in_segments_bytes), 2),
                     fmt(_mib(s.largest_allocated_bytes), 2),
                     "—" if not oom else f"asked {human_bytes(oom.requested_bytes)}, "
                     f"{human_bytes(oom.device_free_bytes)} free"])
    items = [Table("memory-snapshots-table", ["snapshot", "rank", "device", "reserved MiB",
                                               "allocated MiB", "free in segments MiB",
                                               "largest moment MiB", "out of memory"], rows,
                   caption="Each memory snapshot (torch.cuda.memory._dump_snapshot) at the "
                           "moment it was taken; the largest moment is rebuilt from the "
                           "allocator's log, replayed backwards from that state.", left=3)]
    live = report.table("memory_snapshot_live")
    if len(live):
        items.append(Table("memory-snapshot-live-table", ["snapshot", "device", "site",
                                                          "top frames", "MiB", "blocks"],
                           [[r["source"], r["device"], _cell(r["site"]),
                             _cell(r["frames"], 90), f"{r['bytes'] / MIB:.2f}", int(r["blocks"])]
                            for _, r in live.iterrows()],
                           caption="The blocks live at each snapshot's largest moment, grouped "
                                   "by the line that allocated them (the innermost frame "
                                   "outside PyTorch) and their top frames.", left=4))
    seg = report.table("memory_segments")
    if len(seg):
        top = seg.sort_values("free_bytes", ascending=False).head(MAX_SEGMENTS)
        items.append(Table("memory-segments-table", ["snapshot", "device", "segment", "type",
                                                     "size MiB", "allocated MiB",
                                                     "free MiB", "largest free MiB", "blocks"],
                           [[r["source"], r["device"], hex(int(r["address"])),
                             r["segment_type"], f"{r['total_bytes'] / MIB:.2f}",
                             f"{r['allocated_bytes'] / MIB:.2f}", f"{r['free_bytes'] / MIB:.2f}",
                             f"{r['largest_free_bytes'] / MIB:.2f}", int(r["blocks"])]
                            for _, r in top.iterrows()],
                           caption="The segments (cudaMalloc'd memory the allocator holds) "
                                   "with the most free space: free but reserved memory a "
                                   "larger request cannot use — fragmentation."
                                   + (f" The {MAX_SEGMENTS} of {len(seg)} with the most "
                                      f"free space are shown." if len(seg) > MAX_SEGMENTS
                                      else ""), left=4))
    return [Section("Memory snapshots", items, id="memory-snapshots")]


def sections(ctx: PageContext) -> list[Section]:
    rep = ctx.report
    if not has_memory(rep):
        return [Section(None, [Note("memory-none", "This run's traces hold no memory events "
                                    "and no memory snapshot was read: record with "
                                    "profile_memory=True (meshscope run does by default; "
                                    "docs/memory.md), or pass a snapshot to meshscope "
                                    "analyze --snapshot.")])]
    out = []
    line = headline(rep)
    fig = peaks_figure(rep)
    if fig is not None:
        out.append(Section("Peak memory per rank", ([line] if line else []) + [
            Figure("memory-peaks-graph", fig, "Peak allocated: the most memory live tensors "
                   "held at once; peak reserved: the most the caching allocator held from the "
                   "device (what runs out). Over the profiled steps, per rank's main device.")
        ]))
    out.append(Section("Memory findings", [findings_table(rep, ctx.state)]))
    rank = focus_rank(ctx)
    if rank is not None:
        who = rank_label(rank, rep)
        curve = curve_figure(rep, rank)
        items = [Figure("memory-curve-graph", curve, "Allocated and reserved after every "
                        "memory event (a bounded envelope: every peak and trough at its "
                        "height); the grey bands are the profiled steps.")] \
            if curve is not None else []
        for t in (live_table(rep, rank), steps_table(rep, rank), terms_table(rep, rank)):
            if t is not None:
                items.append(t)
        out.append(Section(f"Over time · {who}", items, id="memory-rank"))
    out += snapshot_sections(rep)
    return out
