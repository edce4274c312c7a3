"""``collectors.run_dir`` (its path functions and ``ReportDir``) knows the name of every file a run folder and
its report hold: checked against the committed samples, which a real ``meshscope run`` and
``meshscope analyze`` wrote (samples/regenerate.sh), and against the table registry."""
from __future__ import annotations

import json
import shutil
import pathlib

import pytest

from meshscope.analysis.report import tables
from meshscope.collectors import run_dir as rd

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = sorted(p for p in (ROOT / "samples").iterdir() if (p / rd.RUN_JSON).is_file())


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_every_file_of_a_sample_is_one_the_run_dir_names(sample):
    world = json.loads((sample / rd.RUN_JSON).read_text())["world_size"]
    report = rd.ReportDir.of_run(sample).path
    named = {sample / rd.RUN_JSON, report, sample / rd.LOGS / "launcher.log"}
    for r in range(world):
        named |= {rd.trace_path(sample, r), rd.steps_path(sample, r), rd.comms_path(sample, r),
                  *rd.log_paths(sample, r)}
    found = {p for p in sample.rglob("*") if p.is_file() and report not in p.parents}
    assert found - named == set(), sorted(found - named)
    assert {rd.trace_path(sample, r) for r in range(world)} <= found   # every rank's trace


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_every_file_of_a_sample_report_is_its_summary_its_marker_or_a_registered_table(sample):
    report = rd.ReportDir.of_run(sample)
    registered = {report.table(name) for name in tables.COLUMNS}
    found = {p for p in report.path.iterdir() if p.is_file()}
    assert report.summary in found and report.marker in found     # meshscope wrote it
    own = {report.summary, report.marker}
    assert found - own <= registered, sorted(found - registered)
    assert set(report.tables()) == found - own
    assert report.key.parent == report.cache and report.cache.parent == report.path


def test_a_sweep_folder_is_a_sweep_of_runs_not_a_folder_of_traces(tmp_path):
    """A sweep's folder holds sweep.json, plan.json and comparison.json beside its runs
    (meshscope/layouts/sweep.py). None of them is a trace: the dashboard lists the sweep's run,
    not the sweep folder as one run of three 'traces' (it did while plan.json and
    comparison.json were not named as never-traces), and the analysis takes none of them for a
    trace."""
    from meshscope.analysis.report import inputs
    from meshscope.dashboard.runs import RunIndex

    sweep = tmp_path / "runs" / "sw"
    shutil.copytree(ROOT / "samples" / "dp4-ddp", sweep / "dp4")
    for name in (rd.SWEEP_JSON, rd.PLAN_JSON, rd.COMPARISON_JSON):
        (sweep / name).write_text("{}\n")
    index = RunIndex(tmp_path / "runs")
    assert list(index.runs) == ["sw/dp4"]
    assert index.sweeps == {"sw": ["sw/dp4"]}
    found = inputs.find_traces(sweep)
    assert found and not [f for f in found if f.parent == sweep], found
