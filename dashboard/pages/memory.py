"""Memory: where each rank's memory goes, why a layout runs out — the report's memory tables
(docs/memory.md), shown as they were written.

Each device kind apart — GPUs (cuda/hip) first, the CPU last — every share against the same
device's own memory (``device_total_bytes``; none where the report does not know it), every
byte count in binary units (``model.human_bytes``: KiB, MiB, GiB; a figure's axis in the one
its largest value needs), every axis ending a margin above the largest value it shows, the
device's memory a dashed line inside it or named above it — never an axis stretched to the
device's memory that draws the peaks as slivers.

- ``memory-oom-<i>`` on top: an out-of-memory snapshot's explanation as the report wrote it
  (what the device held, how far from fitting, what makes it fit); a snapshot's caveat where
  its blocks and segments disagree.
- ``memory-headline``: the largest peak of each device kind, where it falls, its share of its
  device's memory, and the stage that holds the most (``memory.devices`` / ``memory.stages``
  of summary.json).
- ``memory-peaks-graph``: one panel per device kind, a group of bars per rank's device — peak
  allocated and peak reserved over the profiled steps (``memory_devices.parquet``);
  ``memory-devices-gpu-table`` / ``memory-devices-cpu-table``: the same peaks with their
  shares of the device's memory and where that memory came from.
- ``memory-findings-table``: the memory findings, as the analysis ranked them, each with a link
  to the page, rank and step that show its evidence (the static report: that place as text).
- About one rank (``?rank=``, else the one with the largest peak): ``memory-curve-graph``,
  allocated and reserved over time (``memory_curve.parquet``: a bounded envelope of every
  memory event, so every peak is drawn at its height), each profiled step a band, the peak
  marked; ``memory-live-table``, the blocks live at its main device's peak grouped by the
  operator, module and range that allocated them (``memory_live.parquet``), its other
  devices' in ``memory-live-table-<device>`` (``-cpu``); ``memory-steps-table``, each
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
from plotly.subplots import make_subplots

from meshscope.analysis.report.model import human_bytes

from ..data import RunReport
from ..sections import (Cell, Figure, Note, Section, Table, clip, evidence_cell,
                        evidence_text, fmt)
from ..state import ViewState
from .common import LAYOUT, PageContext, finding_title, rank_label

MEMORY_IDS = ("near-oom", "memory-imbalance", "memory-growth", "memory-fragmentation",
              "largest-allocator")
MAX_SEGMENTS = 30
COLOURS = {"allocated": "#4C78A8", "reserved": "#F58518", "device": "#E45756",
           "band": "rgba(120, 120, 120, 0.12)", "band_alt": "rgba(120, 120, 120, 0.03)"}


def has_memory(report: RunReport) -> bool:
    return bool(len(report.table("memory_devices")) or len(report.table("memory_segments")))


# -- device kinds and units -----------------------------------------------------------------

KIND_ORDER = ("GPU", "CPU")
KIND_TEXT = {"GPU": "GPU (cuda/hip)", "CPU": "CPU"}
UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
MARGIN = 1.15                   # an axis ends this far above the largest value it shows


def device_kind(device) -> str:
    """``GPU`` for a cuda/hip device, ``CPU`` for the CPU, else the device's type (``xpu``):
    the page shows each kind apart, every share against a device of the same kind's own
    memory."""
    d = str(device)
    if d == "cpu":
        return "CPU"
    head = d.split(":")[0]
    return "GPU" if head in ("cuda", "hip") else head


def kinds_of(devices) -> list[str]:
    """The device kinds present, GPUs first, the CPU last."""
    found = {device_kind(d) for d in devices}
    return sorted(found, key=lambda k: (k == "CPU", k != "GPU", k))


def unit_for(top) -> tuple[str, float]:
    """The binary unit (``human_bytes``'s family: KiB, MiB, GiB, TiB) a figure's axis is drawn
    in: the largest in which ``top`` bytes is at least 1."""
    top = 0.0 if top is None or top != top else float(top)
    for name, size in UNITS:
        if top >= size:
            return name, float(size)
    return "KiB", 1024.0


def _in(b, size: float) -> float | None:
    return None if b is None or b != b else round(float(b) / size, 3)


def share_text(used, total) -> str:
    """``used`` as a share of ``total``, the same device's memory; "—" where it is unknown."""
    if used is None or used != used or not total or total != total:
        return "—"
    return f"{100 * float(used) / float(total):.1f} %"


def _nums(values) -> list[float]:
    return [float(v) for v in values if v is not None and v == v]


def axis_top(values) -> float:
    """Where a memory figure's y axis ends, in bytes: a margin above the largest value it
    shows — never stretched to the device's memory, which would draw the peaks as slivers."""
    return max(_nums(values) or [0.0]) * MARGIN or 1.0


def mark_capacity(fig: go.Figure, totals, top: float, size: float, unit: str,
                  row: int | None = None, col: int | None = None, axis: str = "") -> None:
    """The device's memory on a figure whose axis ends at ``top`` bytes: a dashed line where
    it falls inside the axis, else a note at the top of the plot saying it lies above."""
    where = {} if row is None else {"row": row, "col": col}
    for t in sorted(set(_nums(totals))):
        if t <= top:
            fig.add_hline(y=round(t / size, 3), line_dash="dash", line_color=COLOURS["device"],
                          annotation_text=f"device memory {human_bytes(t)}",
                          annotation_position="top left", **where)
        else:
            fig.add_annotation(x=1, y=1, xref=f"x{axis} domain", yref=f"y{axis} domain",
                               xanchor="right", yanchor="top", showarrow=False,
                               text=f"device memory {human_bytes(t)} ↑ above the axis",
                               font={"color": COLOURS["device"], "size": 11})


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
    """The largest peak of each device kind (GPUs, then the CPU), as a share of that device's
    own memory where the report knows it; the stage holding the most."""
    mem = report.typed.memory
    if not mem.devices:
        return None
    parts = []
    kinds = kinds_of(d.device for d in mem.devices)
    for kind in kinds:
        mine = [d for d in mem.devices if device_kind(d.device) == kind]
        top = max(mine, key=lambda d: d.peak_allocated_bytes or 0.0)
        text = (f"{KIND_TEXT.get(kind, kind)}: the largest peak is rank {top.rank}'s, "
                f"{human_bytes(top.peak_allocated_bytes)} allocated on {top.device}")
        if top.peak_step is not None:
            text += f" in step {top.peak_step}"
        if top.peak_op:
            text += f", at {top.peak_op}" + (f" in {top.peak_module}" if top.peak_module
                                              else "")
        if top.peak_reserved_bytes is not None:
            text += f"; {human_bytes(top.peak_reserved_bytes)} reserved at most"
        if top.device_total_bytes:
            used = top.peak_allocated_bytes if top.peak_reserved_bytes is None \
                else top.peak_reserved_bytes
            text += (f" — {share_text(used, top.device_total_bytes)} of the device's "
                     f"{human_bytes(top.device_total_bytes)}")
        parts.append(text)
    text = ". ".join(parts)
    if len(mem.stages) > 1:
        s = max(mem.stages, key=lambda s: s.peak_allocated_bytes or 0.0)
        text += (f". Stage {s.stage} holds the most: {human_bytes(s.peak_allocated_bytes)} "
                 f"on rank {s.peak_rank}")
    main = mem.main()
    if any(d.totals == "since-start" for d in mem.devices):
        text += (". CPU totals count only what was allocated while the profiler recorded "
                 "(PyTorch's CPU allocator reports nothing older)")
    if any(d.totals == "rebuilt" for d in main):
        text += (". This trace has no allocator totals (PyTorch 1.8): allocated is rebuilt "
                 "from the signed bytes, from 0 at the trace's start")
    return Note("memory-headline", text + ".")


def peaks_figure(report: RunReport) -> go.Figure | None:
    """One panel per device kind (GPUs, then the CPU), each with its own axis: a group of bars
    per rank's device — peak allocated, peak reserved — the axis ending a margin above the
    largest, the device's memory a dashed line inside it or a note above it."""
    dev = report.table("memory_devices")
    if dev.empty:
        return None
    dev = dev.sort_values(["rank", "device"])
    kinds = kinds_of(dev["device"])
    fig = make_subplots(rows=1, cols=len(kinds), horizontal_spacing=0.12,
                        subplot_titles=[KIND_TEXT.get(k, k) for k in kinds])
    for i, kind in enumerate(kinds, start=1):
        d = dev[[device_kind(x) == kind for x in dev["device"]]]
        shown = list(d["peak_allocated_bytes"]) + list(d["peak_reserved_bytes"])
        top = axis_top(shown)
        unit, size = unit_for(top / MARGIN)
        labels = [f"{rank_label(r, report)} · {x}" for r, x in zip(d["rank"], d["device"])]
        share = [share_text(a, t) for a, t in zip(d["peak_allocated_bytes"],
                                                  d["device_total_bytes"])]
        fig.add_bar(name="peak allocated", x=labels,
                    y=[_in(v, size) for v in d["peak_allocated_bytes"]],
                    marker_color=COLOURS["allocated"], legendgroup="allocated",
                    showlegend=i == 1, row=1, col=i,
                    customdata=[[int(r), s if s == s else -1, h, c]
                                for r, s, h, c in zip(d["rank"], d["peak_step"],
                                                      map(human_bytes,
                                                          d["peak_allocated_bytes"]), share)],
                    hovertemplate="%{x}<br>peak allocated %{customdata[2]} in step "
                                  "%{customdata[1]} (%{customdata[3]} of its device's memory)"
                                  "<extra></extra>")
        if d["peak_reserved_bytes"].notna().any():
            fig.add_bar(name="peak reserved", x=labels,
                        y=[_in(v, size) for v in d["peak_reserved_bytes"]],
                        marker_color=COLOURS["reserved"], legendgroup="reserved",
                        showlegend=i == 1 or "peak reserved" not in
                        {t.name for t in fig.data if t.showlegend is not False},
                        row=1, col=i,
                        customdata=[[human_bytes(v), share_text(v, t)] for v, t in
                                    zip(d["peak_reserved_bytes"], d["device_total_bytes"])],
                        hovertemplate="%{x}<br>peak reserved %{customdata[0]} "
                                      "(%{customdata[1]} of its device's memory)"
                                      "<extra></extra>")
        fig.update_yaxes(title_text=unit, range=[0, round(top / size, 3)], row=1, col=i)
        fig.update_xaxes(type="category", row=1, col=i)
        mark_capacity(fig, d["device_total_bytes"], top, size, unit, row=1, col=i,
                      axis=str(i) if i > 1 else "")
    fig.update_layout(**LAYOUT, barmode="group", height=400,
                      title="Peak memory per rank and device over the profiled steps",
                      legend={"orientation": "h", "y": -0.25})
    return fig


def devices_tables(report: RunReport) -> list[Table]:
    """One table per device kind: each rank's device, its peaks and its memory, the shares
    against that device's own memory (summary.json's ``memory.devices``)."""
    devs = report.typed.memory.devices
    out = []
    for kind in kinds_of(d.device for d in devs):
        mine = sorted((d for d in devs if device_kind(d.device) == kind),
                      key=lambda d: (d.rank, d.device))
        rows = [[rank_label(d.rank, report), d.device, human_bytes(d.peak_allocated_bytes),
                 share_text(d.peak_allocated_bytes, d.device_total_bytes),
                 human_bytes(d.peak_reserved_bytes),
                 share_text(d.peak_reserved_bytes, d.device_total_bytes),
                 human_bytes(d.device_total_bytes) if d.device_total_bytes else "—",
                 d.device_total_source or "—"] for d in mine]
        out.append(Table(f"memory-devices-{kind.lower()}-table",
                         ["rank", "device", "peak allocated", "of its memory",
                          "peak reserved", "of its memory", "device memory", "memory from"],
                         rows, left=2,
                         caption=f"{KIND_TEXT.get(kind, kind)} devices: each share is of that "
                                 f"device's own memory ('—' where the report does not know "
                                 f"it: pass --device-memory to meshscope analyze)."))
    return out


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
    peak = row.iloc[0]
    top = axis_top(list(cur["allocated_bytes"]) + list(cur["reserved_bytes"])
                   + [peak["peak_allocated_bytes"]])
    unit, size = unit_for(top / MARGIN)
    t0 = float(steps["start_us"].min()) if len(steps) else float(cur["ts_us"].min())
    x = ((cur["ts_us"] - t0) / 1e3).round(3).tolist()
    fig = go.Figure()
    fig.add_scatter(name="allocated", x=x, y=[_in(v, size) for v in cur["allocated_bytes"]],
                    mode="lines", line={"color": COLOURS["allocated"], "shape": "hv"},
                    hovertemplate=f"%{{x:.2f}} ms: %{{y:.2f}} {unit} allocated<extra></extra>")
    if cur["reserved_bytes"].notna().any():
        fig.add_scatter(name="reserved", x=x, y=[_in(v, size) for v in cur["reserved_bytes"]],
                        mode="lines", line={"color": COLOURS["reserved"], "shape": "hv"},
                        hovertemplate=f"%{{x:.2f}} ms: %{{y:.2f}} {unit} reserved"
                                      f"<extra></extra>")
    for i, (_, s) in enumerate(steps.iterrows()):
        # Every other step shaded, each step's start a dotted line: adjacent steps stay apart.
        fig.add_vrect(x0=(s["start_us"] - t0) / 1e3, x1=(s["end_us"] - t0) / 1e3,
                      fillcolor=COLOURS["band"] if i % 2 == 0 else COLOURS["band_alt"],
                      line_width=0, layer="below",
                      annotation_text=f"step {int(s['step'])}", annotation_position="top left")
        fig.add_vline(x=(s["start_us"] - t0) / 1e3, line_width=1, line_dash="dot",
                      line_color="#888")
    if peak["peak_us"] == peak["peak_us"]:
        fig.add_scatter(name="peak", x=[round((float(peak["peak_us"]) - t0) / 1e3, 3)],
                        y=[_in(peak["peak_allocated_bytes"], size)], mode="markers+text",
                        marker={"color": COLOURS["device"], "size": 11, "symbol": "x"},
                        text=[f"peak {human_bytes(peak['peak_allocated_bytes'])}"],
                        textposition="top center",
                        hovertemplate=f"peak %{{y:.2f}} {unit}<extra></extra>")
    mark_capacity(fig, [peak["device_total_bytes"]], top, size, unit)
    fig.update_layout(**LAYOUT, height=420,
                      title=f"Allocated and reserved over time · {rank_label(rank, report)} "
                            f"· {device}",
                      xaxis_title="ms from the first profiled step's start", yaxis_title=unit,
                      yaxis={"range": [0, round(top / size, 3)]},
                      legend={"orientation": "h", "y": -0.2})
    return fig


def _cell(text, n: int = 60) -> Cell | str:
    text = "" if text is None or text != text else str(text)
    short = clip(text, n)
    return Cell(short, text) if short != text else text


def _by_kind(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame``'s rows, GPUs first, then the other devices, the CPU last."""
    order = {k: i for i, k in enumerate(kinds_of(frame["device"]))}
    key = [order[device_kind(d)] for d in frame["device"]]
    return frame.assign(_kind=key).sort_values(["_kind", "device"], kind="stable") \
        .drop(columns="_kind")


def live_tables(report: RunReport, rank: int) -> list[Table]:
    """The blocks live at each of the rank's devices' own largest peak, one table per device
    (its main device first, ``memory-live-table``): a share is of that device's peak."""
    live = report.table("memory_live")
    mine = live[live["rank"] == rank]
    if mine.empty:
        return []
    main = main_devices(report)
    first = main.loc[main["rank"] == rank, "device"]
    first = str(first.iloc[0]) if len(first) else None
    devices = sorted({str(d) for d in mine["device"]},
                     key=lambda d: (d != first, kinds_of(mine["device"]).index(device_kind(d)),
                                    d))
    out = []
    for device in devices:
        rows_of = mine[mine["device"] == device]
        step = int(rows_of["step"].iloc[0])
        rows = [[device, _cell(r["operator"]), _cell(r["module"] or "—"),
                 _cell(r["annotation"] or "—"), _cell(r["phase"] if isinstance(r.get("phase"), str) else "—"),
                 human_bytes(r["bytes"]),
                 "—" if r["blocks"] != r["blocks"] else int(r["blocks"]),
                 fmt(None if r["share"] != r["share"] else 100 * r["share"], 1)]
                for _, r in rows_of.iterrows()]
        kind = KIND_TEXT.get(device_kind(device), device_kind(device))
        out.append(Table("memory-live-table" if device == devices[0] else
                         f"memory-live-table-{device.replace(':', '-')}",
                         ["device", "operator", "module", "range", "phase", "bytes", "blocks",
                          f"share of {device}'s peak %"], rows,
                         caption=f"{kind} · {device}: the blocks live at rank {rank}'s largest "
                                 f"peak on this device (step {step}), grouped by the operator "
                                 f"that allocated them, the module (with with_modules / "
                                 f"with_stack) and the user range (a microbatch's forward, the "
                                 f"optimizer's step) it ran in, and the phase of the step that made "
                                 f"it (forward, backward, optimizer); each share is of this device's "
                                 f"own peak. '(before the trace)': bytes live then that the "
                                 f"trace never saw allocated.", left=4))
    return out


def steps_table(report: RunReport, rank: int) -> Table | None:
    st = report.table("memory_steps")
    mine = st[st["rank"] == rank]
    if mine.empty:
        return None
    mine = _by_kind(mine.sort_values(["device", "step"]))
    rows = [[r["device"], int(r["step"]), human_bytes(r["peak_allocated_bytes"]),
             _cell(r["peak_allocated_op"] or "—", 40),
             human_bytes(r["peak_reserved_bytes"]), human_bytes(r["fragmentation_bytes"]),
             human_bytes(r["start_allocated_bytes"]), human_bytes(r["end_allocated_bytes"]),
             int(r["events"])]
            for _, r in mine.iterrows()]
    return Table("memory-steps-table", ["device", "step", "peak allocated", "at",
                                        "peak reserved", "reserved − allocated",
                                        "start", "end", "events"], rows,
                 caption="Each profiled step, per device (GPUs first): the peaks, the operator "
                         "at the allocated peak, reserved − allocated at it (memory the "
                         "allocator holds that no tensor uses), and the allocated total at the "
                         "step's start and end — an end higher every step is a leak.", left=1)


def terms_table(report: RunReport, rank: int) -> Table | None:
    terms = report.table("memory_terms")
    mine = terms[terms["rank"] == rank]
    if mine.empty:
        return None
    rows = [[r["device"], r["term"].replace("_", " "), human_bytes(r["bytes"]), r["source"],
             _cell(r["detail"], 70)] for _, r in _by_kind(mine).iterrows()]
    return Table("memory-terms-table", ["device", "term", "bytes", "source", "how"], rows,
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
        rows.append([s.source, s.rank, s.device, human_bytes(s.reserved_bytes),
                     human_bytes(s.allocated_bytes), human_bytes(s.free_in_segments_bytes),
                     human_bytes(s.largest_allocated_bytes),
                     "—" if not oom else f"asked {human_bytes(oom.requested_bytes)}, "
                     f"{human_bytes(oom.device_free_bytes)} free"])
    items = [Table("memory-snapshots-table", ["snapshot", "rank", "device", "reserved",
                                               "allocated", "free in segments",
                                               "largest moment", "out of memory"], rows,
                   caption="Each memory snapshot (torch.cuda.memory._dump_snapshot) at the "
                           "moment it was taken; the largest moment is rebuilt from the "
                           "allocator's log, replayed backwards from that state.", left=3)]
    live = report.table("memory_snapshot_live")
    if len(live):
        items.append(Table("memory-snapshot-live-table", ["snapshot", "device", "site",
                                                          "top frames", "bytes", "blocks"],
                           [[r["source"], r["device"], _cell(r["site"]),
                             _cell(r["frames"], 90), human_bytes(r["bytes"]), int(r["blocks"])]
                            for _, r in live.iterrows()],
                           caption="The blocks live at each snapshot's largest moment, grouped "
                                   "by the line that allocated them (the innermost frame "
                                   "outside PyTorch) and their top frames.", left=4))
    seg = report.table("memory_segments")
    if len(seg):
        top = seg.sort_values("free_bytes", ascending=False).head(MAX_SEGMENTS)
        items.append(Table("memory-segments-table", ["snapshot", "device", "segment", "type",
                                                     "size", "allocated", "free",
                                                     "largest free", "blocks"],
                           [[r["source"], r["device"], hex(int(r["address"])),
                             r["segment_type"], human_bytes(r["total_bytes"]),
                             human_bytes(r["allocated_bytes"]), human_bytes(r["free_bytes"]),
                             human_bytes(r["largest_free_bytes"]), int(r["blocks"])]
                            for _, r in top.iterrows()],
                           caption="The segments (cudaMalloc'd memory the allocator holds) "
                                   "with the most free space: free but reserved memory a "
                                   "larger request cannot use — fragmentation."
                                   + (f" The {MAX_SEGMENTS} of {len(seg)} with the most "
                                      f"free space are shown." if len(seg) > MAX_SEGMENTS
                                      else ""), left=4))
    return [Section("Memory snapshots", items, id="memory-snapshots")]


def oom_notes(report: RunReport) -> list[Note]:
    """Each out-of-memory snapshot's explanation, as the report wrote it (``Oom.explained``,
    ``fits_if``), and each snapshot's caveat where its blocks and segments disagree: the page
    opens with them."""
    out = []
    for i, s in enumerate(report.typed.memory.snapshots):
        oom = s.oom
        if oom is not None and oom.explained:
            text = f"Out of memory on rank {s.rank}, {s.device} ({s.source}): {oom.explained}"
            if oom.fits_if:
                text += " It fits if: " + "; ".join(oom.fits_if) + "."
            out.append(Note(f"memory-oom-{i}", text, warn=True))
        if getattr(s, "caveat", None):
            out.append(Note(f"memory-snapshot-caveat-{i}", f"{s.source}: {s.caveat}",
                            warn=True))
    return out


def sections(ctx: PageContext) -> list[Section]:
    rep = ctx.report
    if not has_memory(rep):
        return [Section(None, [Note("memory-none", "This run's traces hold no memory events "
                                    "and no memory snapshot was read: record with "
                                    "profile_memory=True (meshscope run does by default; "
                                    "docs/memory.md), or pass a snapshot to meshscope "
                                    "analyze --snapshot.")])]
    oom = oom_notes(rep)
    out = [Section(None, oom, id="memory-oom")] if oom else []
    line = headline(rep)
    fig = peaks_figure(rep)
    if fig is not None:
        out.append(Section("Peak memory per rank", ([line] if line else []) + [
            Figure("memory-peaks-graph", fig, "Peak allocated: the most memory live tensors "
                   "held at once; peak reserved: the most the caching allocator held from the "
                   "device (what runs out). Over the profiled steps, each device kind in its "
                   "own panel, its axis a margin above its largest peak; the device's memory "
                   "is a dashed line, or named at the top where it lies above the axis.")
        ] + devices_tables(rep)))
    out.append(Section("Memory findings", [findings_table(rep, ctx.state)]))
    rank = focus_rank(ctx)
    if rank is not None:
        who = rank_label(rank, rep)
        curve = curve_figure(rep, rank)
        items = [Figure("memory-curve-graph", curve, "Allocated and reserved after every "
                        "memory event (a bounded envelope: every peak and trough at its "
                        "height); the grey bands are the profiled steps.")] \
            if curve is not None else []
        items += live_tables(rep, rank)
        for t in (steps_table(rep, rank), terms_table(rep, rank)):
            if t is not None:
                items.append(t)
        out.append(Section(f"Over time · {who}", items, id="memory-rank"))
    out += snapshot_sections(rep)
    return out
