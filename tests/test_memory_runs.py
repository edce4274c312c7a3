"""Memory on the runner's own CPU runs, whose premises are built in: the allocator's bytes are
deterministic (no timing enters them), a leak is injected at a known size (``--inject
leak=R:MB``: rank R keeps MB MiB more at every step), and the pipeline's first stage holds
more microbatches in flight by its schedule (1F1B: p against the last stage's one).

- A leaking run and its healthy twin (pp=2, the ``balanced`` model, so activations outweigh
  the last stage's logits): the growth finding names the leaking rank and 8 MiB a step on the
  first, nothing on the second, whose every step ends where the one before did; the healthy
  run names stage 0 as the larger holder.
- The near-OOM finding, with ``--device-memory`` just above the healthy run's peak and far
  above it.
- For each ``--dp-mode`` the runner has (ddp, fsdp, zero2; dp=2, the first step profiled): the
  planner's model states against what the run's own trace measures (its [memory] events and
  its census), through ``meshscope compare --detail`` too.
- The Perfetto export's memory counters against the traces' raw events; a snapshot found in a
  run folder; the Memory page's numbers against the report.
"""
from __future__ import annotations

import gzip
import json
import pathlib
import pickle
import shutil

import pandas as pd
import pytest

from conftest import meshscope
from test_memory_snapshot import hand_made

MiB = 1 << 20
pytestmark = pytest.mark.slow


def _run(out: pathlib.Path, *args) -> pathlib.Path:
    meshscope("run", *args, "--out", out, timeout=900, check=True)
    meshscope("analyze", out, check=True)
    return out


def _summary(run: pathlib.Path, report: str = "report") -> dict:
    return json.loads((run / report / "summary.json").read_text())


def _ids(summary: dict) -> list[str]:
    return [f["id"] for f in summary["findings"]]


@pytest.fixture(scope="module")
def twins(memory_twins):
    """(healthy, leaking): ``conftest.memory_twins``, shared with the Memory page's browser
    test."""
    return memory_twins


def test_the_leak_is_named_and_its_healthy_twin_is_not(twins):
    healthy, leak = twins
    s = _summary(leak)
    (f,) = [x for x in s["findings"] if x["id"] == "memory-growth"]
    assert f["evidence"]["ranks"] == [1] and f["evidence"]["growth_per_step_bytes"] == 8 * MiB
    assert f["peak_saving_bytes"] == 16 * MiB            # over the three profiled steps
    steps = pd.read_parquet(leak / "report" / "memory_steps.parquet")
    ends = steps[steps["rank"] == 1].sort_values("step")["end_allocated_bytes"].tolist()
    assert [b - a for a, b in zip(ends, ends[1:])] == [8 * MiB, 8 * MiB]
    h = _summary(healthy)
    assert "memory-growth" not in _ids(h)
    for d in h["memory"]["devices"]:
        assert d["growth_per_step_bytes"] == 0 and not d["growth_monotone"]
    hs = pd.read_parquet(healthy / "report" / "memory_steps.parquet")
    for _, g in hs.groupby("rank"):
        assert g["end_allocated_bytes"].nunique() == 1


def test_pp2_names_stage_0_as_the_larger_holder(twins):
    healthy, _ = twins
    s = _summary(healthy)
    stages = {st["stage"]: st for st in s["memory"]["stages"]}
    assert stages[0]["peak_allocated_bytes"] > stages[1]["peak_allocated_bytes"]
    (f,) = [x for x in s["findings"] if x["id"] == "memory-imbalance"]
    assert f["evidence"]["by"] == "stage" and f["evidence"]["largest"] == 0
    assert "first stage" in f["remedy"]
    # What it holds more of: the activations of its microbatches in flight — measured from
    # the forward ranges' blocks live at each rank's peak, and so the planner says too.
    from meshscope.layouts.memory_vs_plan import memory_vs_plan
    rows = {(r.rank, r.term): r for r in memory_vs_plan(healthy).rows}
    assert rows[(0, "activations")].measured_bytes > rows[(1, "activations")].measured_bytes
    assert rows[(0, "activations")].planned_bytes > rows[(1, "activations")].planned_bytes
    text = meshscope("analyze", healthy, check=True).stdout
    assert "stage 0 (ranks [0]): peak" in text and "Stage 0 holds the most memory" in text


def test_near_oom_with_the_device_memory_given(twins, tmp_path):
    healthy, _ = twins
    devices = _summary(healthy)["memory"]["devices"]
    top = max(devices, key=lambda d: d["peak_allocated_bytes"])
    tight = int(top["peak_allocated_bytes"] * 1.05)
    s = json.loads(meshscope("analyze", healthy, "--out", tmp_path / "tight", "--json",
                             "--device-memory", str(tight), check=True).stdout)
    f = s["findings"][0]
    assert f["id"] == "near-oom" and f["evidence"]["rank"] == top["rank"]
    assert f["evidence"]["device_total_source"] == "--device-memory"
    roomy = json.loads(meshscope("analyze", healthy, "--out", tmp_path / "roomy", "--json",
                                 "--device-memory", str(10 * tight), check=True).stdout)
    assert "near-oom" not in _ids(roomy)
    bad = meshscope("analyze", healthy, "--out", tmp_path / "bad", "--device-memory", "lots")
    assert bad.returncode == 2 and "--device-memory" in bad.stderr


@pytest.fixture(scope="module")
def dp_modes(tmp_path_factory):
    """One dp=2 run per --dp-mode, every step profiled from the first (the optimizer's state
    is made in the first step: its allocation is then in the trace), one microbatch."""
    root = tmp_path_factory.mktemp("dp-modes")
    return {mode: _run(root / mode, "--layout", "dp=2", "--dp-mode", mode, "--steps", "3",
                       "--profile-steps", "0-2", "--microbatches", "1")
            for mode in ("ddp", "fsdp", "zero2")}


def _terms(run) -> dict:
    from meshscope.layouts.memory_vs_plan import memory_vs_plan
    return {(r.rank, r.term): r for r in memory_vs_plan(run).rows}


def _close(a: float, b: float) -> bool:
    """Equal but for Adam's step counters (a 4-byte tensor per parameter tensor): 0.1%."""
    return abs(a - b) <= 1e-3 * max(a, b)


# zero2 was planned at Ψ·p (classic ZeRO-2) while the runner's zero2 (FSDP2 without
# re-sharding after forward) stores Ψ·p/N_d: 0.44 MiB measured against 0.88 planned, until the
# planner's runner model counted them sharded (the gathered copy stays a runtime buffer).
@pytest.mark.parametrize("mode", ["ddp", "fsdp", "zero2"])
def test_the_planners_parameters_are_what_the_run_holds(dp_modes, mode):
    rows = _terms(dp_modes[mode])
    for rank in (0, 1):
        r = rows[(rank, "weights")]
        assert r.source == "census" and _close(r.measured_bytes, r.planned_bytes), r


def test_compare_detail_sets_the_plan_beside_the_run(dp_modes):
    out = meshscope("compare", dp_modes["ddp"], dp_modes["zero2"], "--detail",
                    check=True).stdout
    assert out.count("memory, planned against measured (MiB):") == 2
    assert "gradients" in out and "optimizer state" in out
    assert "a CPU trace cannot show them" in out       # runtime buffers, said so


def test_perfetto_counters_are_the_traces_memory_events(twins, tmp_path):
    _, leak = twins
    out = tmp_path / "trace.json"
    meshscope("export", leak, "--perfetto", out, check=True)
    doc = json.loads(out.read_text())
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    for rank in (0, 1):
        raw = json.load(gzip.open(leak / "traces" / f"rank{rank}.json.gz"))["traceEvents"]
        mem = sorted((e for e in raw if e.get("name") == "[memory]"), key=lambda e: e["ts"])
        mine = [e for e in counters if e["pid"] == rank]
        assert len(mine) == len(mem) > 0
        assert {e["name"] for e in mine} == {"memory cpu"}
        assert [e["args"]["allocated"] for e in mine] == \
            [e["args"]["Total Allocated"] for e in mem]
    assert doc["otherData"]["meshscope"]["memory_counters"] == len(counters)


def test_a_snapshot_in_the_run_folder_is_read(twins, tmp_path):
    healthy, _ = twins
    run = tmp_path / "run"
    shutil.copytree(healthy, run, ignore=shutil.ignore_patterns("report"))
    (run / "memory").mkdir()
    (run / "memory" / "rank1.pickle").write_bytes(pickle.dumps(hand_made()))
    (run / "memory" / "notes.pkl").write_bytes(pickle.dumps({"not": "a snapshot"}))
    s = json.loads(meshscope("analyze", run, "--json", check=True).stdout)
    (snap,) = s["memory"]["snapshots"]
    assert snap["rank"] == 1 and snap["largest_allocated_bytes"] == 18 * MiB
    assert any("notes.pkl" in p and "not a memory snapshot" in p for p in s["problems"])
    assert s["findings"][0]["id"] == "near-oom"        # the snapshot's out-of-memory record


def test_the_memory_page_shows_the_reports_numbers(twins, tmp_path):
    from meshscope.dashboard import state as st
    from meshscope.dashboard.app import BUILDERS
    from meshscope.dashboard.data import open_report
    from meshscope.dashboard.pages.common import PageContext
    from meshscope.dashboard.runs import RunIndex
    from meshscope.dashboard.static_report import render_html

    _, leak = twins
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copytree(leak, runs / "leak")
    rep = open_report(RunIndex(runs).get("leak"))
    items = {i.id: i for s in BUILDERS["memory"](PageContext(rep, st.ViewState(
        page="memory", runs=("leak",), rank=1))) for i in s.items}
    devices = pd.read_parquet(leak / "report" / "memory_devices.parquet").sort_values("rank")
    # The runner's CPU runs: one panel (the CPU), its axis in the binary unit of its peaks.
    units = {"KiB": 1 << 10, "MiB": MiB, "GiB": 1 << 30}
    peaks = items["memory-peaks-graph"].figure
    bars, size = peaks.data[0], units[peaks.layout.yaxis.title.text]
    assert list(bars.y) == [round(b / size, 3) for b in devices["peak_allocated_bytes"]]
    assert peaks.layout.yaxis.range[1] < 1.2 * max(devices["peak_allocated_bytes"]) / size
    curve = items["memory-curve-graph"].figure
    peak = float(devices.loc[devices["rank"] == 1, "peak_allocated_bytes"].iloc[0])
    assert max(curve.data[0].y) == round(peak / units[curve.layout.yaxis.title.text], 3)
    assert any("Memory grows on rank 1" in str(r[1]) for r in items["memory-findings-table"].rows)
    live = pd.read_parquet(leak / "report" / "memory_live.parquet")
    assert len(items["memory-live-table"].rows) == len(live[live["rank"] == 1])
    html = render_html(rep)
    assert 'id="memory-peaks-graph"' in html and 'id="page-memory"' in html
