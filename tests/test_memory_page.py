"""The Memory page on a report made by hand whose answers are known by construction: the
shipped sample dp4-ddp's report with memory written into it — ranks 0 and 1 each with a GPU
(cuda:0, 80 GiB) and the CPU, rank 0's CPU peak 36.75 MiB with no known memory, rank 1's CPU
100 MiB of a 110 MiB memory given by ``--device-memory``.

- GPU and CPU rows apart (a table and a figure panel per kind), every share against the same
  device's own memory: the 36.75 MiB CPU row shows no share (never "100 %" of anything), rank
  1's CPU 90.9 % of its 110 MiB, the GPUs against 80 GiB.
- One unit family: no decimal unit ("MB", "GB") anywhere in the page's text, its tables, its
  figures' titles, axes, annotations and hover texts, nor in a memory finding's evidence.
- The axes end a margin above the largest peak, not at the 80 GiB capacity, which is named
  above the axis; a capacity inside the axis is a dashed line at its height.
- The page's numbers are the report's: the bars are ``memory_devices``' peaks.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import shutil

import pandas as pd
import pytest

from meshscope.analysis.report import model, tables
from meshscope.dashboard import state as st
from meshscope.dashboard.app import BUILDERS
from meshscope.dashboard.data import open_report
from meshscope.dashboard.pages import memory
from meshscope.dashboard.pages.common import PageContext
from meshscope.dashboard.runs import RunIndex
from meshscope.dashboard.sections import Figure, Note, Table, evidence_text

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "samples" / "dp4-ddp"
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
DECIMAL = re.compile(r"(?<![A-Za-z])[kKMGT]B(?![A-Za-z])")   # "MB", "GB", not "MiB"


def _device(rank, device, alloc, reserved, total, source, totals="absolute"):
    return {"rank": rank, "device": device, "totals": totals, "events": 10, "steps": 2,
            "peak_allocated_bytes": float(alloc), "peak_step": 5, "peak_us": 1500.0,
            "peak_op": "aten::mm", "peak_module": None, "peak_annotation": None,
            "peak_reserved_bytes": None if reserved is None else float(reserved),
            "reserved_at_peak_bytes": None if reserved is None else float(reserved),
            "fragmentation_bytes": None if reserved is None else float(reserved - alloc),
            "growth_per_step_bytes": 0.0, "growth_steps": 2, "growth_monotone": False,
            "device_total_bytes": None if total is None else float(total),
            "device_total_source": source, "stage": None}


DEVICES = [_device(0, "cuda:0", 6 * GiB, 8 * GiB, 80 * GiB, "trace"),
           _device(0, "cpu", 36.75 * MiB, None, None, None, "since-start"),
           _device(1, "cuda:0", 3 * GiB, 4 * GiB, 80 * GiB, "trace"),
           _device(1, "cpu", 100 * MiB, None, 110 * MiB, "--device-memory", "since-start")]


# A snapshot's record with every field the report's model has (those not given null), as
# summary.json writes it.
SNAPSHOT = {f.name: None for f in dataclasses.fields(model.MemorySnapshot)} | {"rank": 0, "device": "cuda:0", "source": "handmade/memory/rank0.pickle",
            "reserved_bytes": float(8 * GiB), "allocated_bytes": float(6 * GiB),
            "free_in_segments_bytes": float(2 * GiB), "largest_allocated_bytes": float(6 * GiB),
            "largest_reserved_bytes": float(8 * GiB), "largest_at_us": None,
            "trace_entries": 0, "caveat": None,
            "oom": {"requested_bytes": 4 * GiB, "device_free_bytes": 1 * GiB,
                    "allocated_bytes": 6 * GiB, "reserved_bytes": 8 * GiB, "time_us": None,
                    "site": None, "explained": "the weights held 6.00 GiB.",
                    "held_bytes": {"weights": float(6 * GiB)}, "shortfall_bytes": 3 * GiB,
                    "fits_if": ["weights in bf16 (saves 3.00 GiB)"], "sites": []}}
assert set(SNAPSHOT) == {f.name for f in dataclasses.fields(model.MemorySnapshot)}


def _write(report: pathlib.Path, name: str, rows: list[dict]) -> None:
    df = pd.DataFrame(rows, columns=tables.COLUMNS[name])
    df.to_parquet(report / f"{name}.parquet", index=False)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    runs = tmp_path_factory.mktemp("memory-page") / "runs"
    run = runs / "handmade"
    run.mkdir(parents=True)
    shutil.copy(SAMPLE / "run.json", run / "run.json")
    shutil.copytree(SAMPLE / "report", run / "report")
    rep = run / "report"
    summary = json.loads((rep / "summary.json").read_text())
    summary["memory"] = {"devices": DEVICES, "stages": [], "snapshots": [SNAPSHOT],
                         "device_memory_bytes": float(110 * MiB)}
    summary["findings"].append({
        "id": "largest-allocator", "severity": "medium", "dimension": None, "cost_us": None,
        "cost_pct": None, "title": "aten::mm holds 3.00 GiB (50%) of rank 0's peak",
        "evidence": {"rank": 0, "device": "cuda:0", "group_bytes": 3 * GiB,
                     "peak_allocated_bytes": 6 * GiB, "share": 0.5},
        "remedy": "recompute the activations", "what_if": {}, "symptoms": [],
        "peak_saving_bytes": float(3 * GiB),
        "cites": [{"table": "memory_live", "rank": 0, "step": 5, "keys": {},
                   "page": "memory"}], "caveats": []})
    (rep / "summary.json").write_text(json.dumps(summary))
    _write(rep, "memory_devices", DEVICES)
    curve = []
    for rank, dev, alloc, res in [(0, "cuda:0", 6 * GiB, 8 * GiB), (0, "cpu", 36.75 * MiB, None),
                                  (1, "cuda:0", 3 * GiB, 4 * GiB), (1, "cpu", 100 * MiB, None)]:
        for ts, f in [(1000.0, 0.5), (1500.0, 1.0), (1900.0, 0.25)]:
            curve.append({"rank": rank, "device": dev, "ts_us": ts, "allocated_bytes": alloc * f,
                          "reserved_bytes": res, "step": 5})
    _write(rep, "memory_curve", curve)
    _write(rep, "memory_steps", [
        {"rank": r, "device": d["device"], "step": 5, "start_us": 900.0, "end_us": 2000.0,
         "events": 10, "alloc_bytes": d["peak_allocated_bytes"],
         "free_bytes": d["peak_allocated_bytes"] * 0.75,
         "start_allocated_bytes": d["peak_allocated_bytes"] * 0.5,
         "end_allocated_bytes": d["peak_allocated_bytes"] * 0.25,
         "peak_allocated_bytes": d["peak_allocated_bytes"], "peak_allocated_us": 1500.0,
         "peak_allocated_op": "aten::mm", "peak_reserved_bytes": d["peak_reserved_bytes"],
         "peak_reserved_us": 1500.0, "reserved_at_peak_bytes": d["peak_reserved_bytes"],
         "fragmentation_bytes": d["fragmentation_bytes"], "totals": d["totals"]}
        for d in DEVICES for r in [d["rank"]]])
    _write(rep, "memory_live", [
        {"rank": 0, "device": "cuda:0", "step": 5, "operator": "aten::mm", "module": None,
         "annotation": None, "bytes": 3 * GiB, "blocks": 3, "share": 0.5},
        {"rank": 0, "device": "cuda:0", "step": 5, "operator": "aten::empty", "module": None,
         "annotation": None, "bytes": 3 * GiB, "blocks": 1, "share": 0.5},
        {"rank": 0, "device": "cpu", "step": 5, "operator": "aten::empty", "module": None,
         "annotation": None, "bytes": 36.75 * MiB, "blocks": 2, "share": 1.0}])
    return open_report(RunIndex(runs).get("handmade"))


def _items(rep, rank=None) -> dict:
    return {i.id: i for s in BUILDERS["memory"](PageContext(rep, st.ViewState(
        page="memory", runs=("handmade",), rank=rank))) for i in s.items}


def _texts(items: dict) -> list[str]:
    """Every text the page shows: notes, tables (columns, cells, captions), figures (titles,
    axis titles, trace names, texts and hover texts, annotations)."""
    out = []
    for i in items.values():
        if isinstance(i, Note):
            out.append(i.text)
        elif isinstance(i, Table):
            out += [*map(str, i.columns), i.caption or ""]
            out += [str(c) for row in i.rows for c in row]
        elif isinstance(i, Figure):
            fig = i.figure
            out += [i.caption or "", str(fig.layout.title.text)]
            out += [str(a.title.text) for k in fig.layout if k.startswith(("xaxis", "yaxis"))
                    for a in [fig.layout[k]]]
            out += [str(a.text) for a in fig.layout.annotations]
            for t in fig.data:
                out += [str(t.name), str(t.hovertemplate), str(getattr(t, "text", ""))]
                out += [str(c) for c in (t.customdata if t.customdata is not None else [])]
    return out


def test_gpu_and_cpu_apart_each_share_against_its_own_memory(report):
    items = _items(report)
    gpu = items["memory-devices-gpu-table"]
    cpu = items["memory-devices-cpu-table"]
    cols = list(gpu.columns)
    assert [r[1] for r in gpu.rows] == ["cuda:0", "cuda:0"]
    assert [r[1] for r in cpu.rows] == ["cpu", "cpu"]
    g0, g1 = gpu.rows
    c0, c1 = cpu.rows
    # Shares of the same device's memory: 6/80, 8/80, 3/80, 4/80 GiB; rank 1's CPU 100/110 MiB.
    assert (g0[2], g0[3], g0[4], g0[5], g0[6]) == ("6.00 GiB", "7.5 %", "8.00 GiB", "10.0 %",
                                                   "80.00 GiB")
    assert (g1[3], g1[5]) == ("3.8 %", "5.0 %")
    assert c1[cols.index("peak allocated")] == "100.00 MiB"
    assert (c1[3], c1[6], c1[7]) == ("90.9 %", "110.00 MiB", "--device-memory")
    # The 36.75 MiB CPU row: no memory known for it, so no share — never one against a GPU's.
    assert c0[2] == "36.75 MiB" and c0[3] == "—" and c0[6] == "—"
    assert not any("100" in str(c) and "%" in str(c) for c in c0)
    # The headline names each kind's largest peak, the GPU's as a share of its own memory.
    head = items["memory-headline"].text
    assert "GPU (cuda/hip): the largest peak is rank 0's, 6.00 GiB allocated on cuda:0" in head
    assert "10.0 % of the device's 80.00 GiB" in head
    assert "CPU: the largest peak is rank 1's, 100.00 MiB allocated on cpu" in head
    # The live blocks: the main device's table holds its own rows only; the CPU's apart,
    # its 100 % a share of the CPU's own peak, said so.
    live = items["memory-live-table"]
    assert {r[0] for r in live.rows} == {"cuda:0"} and len(live.rows) == 2
    assert [r[5] for r in live.rows] == ["3.00 GiB", "3.00 GiB"]
    other = items["memory-live-table-cpu"]
    assert [(r[0], r[5], r[7]) for r in other.rows] == [("cpu", "36.75 MiB", "100.0")]
    assert other.columns[-1] == "share of cpu's peak %"
    steps = items["memory-steps-table"]
    assert [r[0] for r in steps.rows] == ["cuda:0", "cpu"]        # GPUs first


def test_one_binary_unit_family_everywhere(report):
    for rank in (None, 1):
        texts = _texts(_items(report, rank))
        bad = [t for t in texts if DECIMAL.search(t)]
        assert not bad, bad
        assert any("GiB" in t for t in texts) and any("MiB" in t for t in texts)
    # The memory finding's evidence, through the helper every page uses: binary units.
    (f,) = [f for f in report.typed.findings if f.id == "largest-allocator"]
    text = evidence_text(f.evidence)
    assert "Group: 3.00 GiB." in text and "Peak allocated: 6.00 GiB." in text
    assert not DECIMAL.search(text)
    (row,) = _items(report)["memory-findings-table"].rows
    assert row[2] == "3.00 GiB" and not DECIMAL.search(row[3])


def test_axes_end_near_the_peaks_and_mark_the_capacity(report):
    items = _items(report)
    fig = items["memory-peaks-graph"].figure
    # Panel 1: the GPUs, in GiB, the axis a margin above the largest peak (8 GiB reserved).
    assert fig.layout.yaxis.title.text == "GiB"
    top = fig.layout.yaxis.range[1]
    assert 8 < top <= 8 * 1.2 and top < 80
    gpu_bars = [t for t in fig.data if t.yaxis == "y" and t.name == "peak allocated"]
    assert list(gpu_bars[0].y) == [6.0, 3.0]
    assert list(gpu_bars[0].x) == ["rank 0 · cuda:0", "rank 1 · cuda:0"] or \
        all("cuda:0" in x for x in gpu_bars[0].x)
    notes = [a.text for a in fig.layout.annotations]
    assert any(n.startswith("device memory 80.00 GiB") and "above the axis" in n
               for n in notes), notes
    # Panel 2: the CPU, in MiB, its axis its own; rank 1's 110 MiB inside it: a dashed line.
    assert fig.layout.yaxis2.title.text == "MiB"
    top2 = fig.layout.yaxis2.range[1]
    assert 110 < top2 <= 100 * 1.2
    cpu_bars = [t for t in fig.data if t.yaxis == "y2" and t.name == "peak allocated"]
    assert list(cpu_bars[0].y) == [36.75, 100.0]
    lines = [s for s in fig.layout.shapes if s.yref == "y2"]
    assert [(s.y0, s.line.dash) for s in lines] == [(110.0, "dash")]
    assert any(n == "device memory 110.00 MiB" for n in notes)
    # The curve of rank 0's GPU: its axis ends above its 8 GiB reserved, the 80 GiB named.
    curve = items["memory-curve-graph"].figure
    assert curve.layout.yaxis.title.text == "GiB"
    assert 8 < curve.layout.yaxis.range[1] <= 8 * 1.2
    assert max(curve.data[0].y) == 6.0
    assert any(str(a.text).startswith("device memory 80.00 GiB")
               for a in curve.layout.annotations)


def test_the_bars_are_the_reports_numbers(report):
    fig = _items(report)["memory-peaks-graph"].figure
    dev = report.table("memory_devices")
    for axis, unit, size in (("y", "GiB", GiB), ("y2", "MiB", MiB)):
        kind = "GPU" if axis == "y" else "CPU"
        d = dev[[memory.device_kind(x) == kind for x in dev["device"]]].sort_values("rank")
        bars = {t.name: t for t in fig.data if t.yaxis == axis}
        assert list(bars["peak allocated"].y) == [round(b / size, 3)
                                                 for b in d["peak_allocated_bytes"]]
    assert memory.unit_for(1023 * KiB) == ("KiB", KiB)
    assert memory.unit_for(36.75 * MiB) == ("MiB", MiB)
    assert memory.unit_for(80 * GiB) == ("GiB", GiB)


def test_an_out_of_memory_explanation_opens_the_page(report):
    first = BUILDERS["memory"](PageContext(report, st.ViewState(
        page="memory", runs=("handmade",))))[0]
    (note,) = first.items
    assert note.id == "memory-oom-0" and note.warn
    assert note.text == ("Out of memory on rank 0, cuda:0 (handmade/memory/rank0.pickle): the "
                         "weights held 6.00 GiB. It fits if: weights in bf16 (saves 3.00 GiB).")
    (row,) = _items(report)["memory-snapshots-table"].rows
    assert row[3:] == ["8.00 GiB", "6.00 GiB", "2.00 GiB", "6.00 GiB",
                       "asked 4.00 GiB, 1.00 GiB free"]
