"""The notebook API returns the same numbers the CLI writes."""
import json
import shutil

import pandas as pd

from meshscope import analysis
from conftest import ROOT, meshscope


def test_open_returns_what_analyze_writes(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(ROOT / "samples" / "dp2-pp2-1f1b", run, ignore=shutil.ignore_patterns("report"))
    meshscope("analyze", run, "--no-cache", check=True)
    api = analysis.open(run)
    for name in ("breakdown", "bubbles", "bandwidth", "pipeline_phases", "stage_imbalance"):
        written = pd.read_parquet(run / "report" / f"{name}.parquet")
        pd.testing.assert_frame_equal(getattr(api, name)().reset_index(drop=True), written,
                                      check_dtype=False)
    written = json.loads((run / "report" / "summary.json").read_text())
    from meshscope.analysis.report import codec

    # the notebook's summary is the record summary.json was written from
    typed = api.summary()
    assert codec.encode(typed.per_rank_mean) == written["per_rank_mean"]
    assert typed.step_time_us == written["step_time_us"]
    assert [str(f.id) for f in api.findings()] == [f["id"] for f in written["findings"]]
    assert "RunAnalysis" in repr(api)


def test_options_record_and_fields_are_one_way(tmp_path):
    """``analyze(path, AnalysisOptions(...))`` and ``analyze(path, field=...)`` are the same
    analysis (the fields replace the record's), and an option that does not exist is refused
    by name rather than ignored."""
    import dataclasses

    import pytest

    from meshscope.analysis.report.analyze import AnalysisOptions, analyze

    run = tmp_path / "run"
    shutil.copytree(ROOT / "samples" / "dp2-pp2-1f1b", run, ignore=shutil.ignore_patterns("report"))
    by_record = analyze(run, AnalysisOptions(warmup_steps=2, workers=1))
    by_fields = analyze(run, warmup_steps=2, workers=1)
    assert by_record.step_records.warmup_steps == by_fields.step_records.warmup_steps
    assert by_record.summary.per_rank_mean == by_fields.summary.per_rank_mean
    pd.testing.assert_frame_equal(by_record.steps.breakdown, by_fields.steps.breakdown)
    with pytest.raises(TypeError, match="warmup"):
        analyze(run, warmup=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        AnalysisOptions().warmup_steps = 3


def test_budgets_hold_for_the_analysis_alone(tmp_path, monkeypatch):
    """Budgets given in the options are in force while the analysis runs (a trace past them
    is refused, its rank a problem) and this process' environment is as it was after."""
    import os

    from meshscope.analysis.ingest import budgets
    from meshscope.analysis.report.analyze import AnalysisOptions, analyze

    for var in budgets.ENV.values():
        monkeypatch.delenv(var, raising=False)
    run = tmp_path / "run"
    shutil.copytree(ROOT / "samples" / "dp2-pp2-1f1b", run, ignore=shutil.ignore_patterns("report"))
    tight = budgets.Budgets(events=10)
    report = analyze(run, AnalysisOptions(workers=1, budgets=tight))
    refused = [p for p in report.problems if "--max-events" in p]
    assert refused, report.problems
    assert all(os.environ.get(var) is None for var in budgets.ENV.values())
