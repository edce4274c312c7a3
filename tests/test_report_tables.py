"""Every table a report writes has the columns its registry entry names
(``analysis/report/tables.py``), whether it has rows or not, and docs/report-format.md
describes each table."""
import shutil

import pandas as pd
import pytest

from conftest import ROOT, meshscope
from meshscope.analysis.report import tables

SAMPLES = sorted(p.parent for p in (ROOT / "samples").glob("*/report"))


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_every_sample_table_has_its_registered_columns(sample):
    """The committed samples as `meshscope analyze` wrote them: pipelines and none, GPU tables
    empty (CPU runs), MoE with Flight Recorder dumps. An empty table (the bubbles of a run
    without a pipeline) has its columns too."""
    empty = []
    for name, columns in tables.COLUMNS.items():
        df = pd.read_parquet(sample / "report" / f"{name}.parquet")
        assert list(df.columns) == columns, (sample.name, name)
        if df.empty:
            empty.append(name)
    assert set(tables.GPU) <= set(empty)          # CPU runs: no device tables filled


def test_a_report_without_traces_writes_every_table_with_its_columns(tmp_path):
    """A run folder whose traces are gone: the report comes from step timers and Flight
    Recorder dumps alone, and its empty tables still carry their columns (they were written
    with none: `critical_path`, `pipeline_phases`, `stage_imbalance`)."""
    run = tmp_path / "run"
    shutil.copytree(ROOT / "samples" / "dp2-pp2-1f1b", run,
                    ignore=shutil.ignore_patterns("report", "traces"))
    out = meshscope("analyze", run)
    assert out.returncode == 0, out.stderr
    for name, columns in tables.COLUMNS.items():
        df = pd.read_parquet(run / "report" / f"{name}.parquet")
        assert list(df.columns) == columns, name
    heatmap = pd.read_parquet(run / "report" / "step_heatmap.parquet")
    assert len(heatmap) > 0                       # the step timers were read


def test_report_format_names_every_table():
    doc = (ROOT / "docs" / "report-format.md").read_text()
    missing = [name for name in tables.NAMES if f"`{name}.parquet`" not in doc]
    assert not missing, missing


def test_the_report_holds_each_registered_table_once_in_its_group(tmp_path):
    """``Report.tables()`` walks the registry's groups (``tables.GROUPS``): every registered
    table once — so a group added to the registry but not to the Report (its tables never
    written) fails here."""
    from meshscope.analysis.report.analyze import analyze

    run = tmp_path / "run"
    shutil.copytree(ROOT / "samples" / "dp2-pp2-1f1b", run,
                    ignore=shutil.ignore_patterns("report", "traces"))
    rep = analyze(run, workers=1)
    names = [name for name, _ in rep.tables()]
    assert sorted(names) == sorted(tables.NAMES) and len(names) == len(set(names))
    groups = {type(getattr(rep, f)): f for f in vars(rep) if isinstance(getattr(rep, f),
                                                                          tables.GROUPS)}
    assert set(groups) == set(tables.GROUPS)
    assert len(rep.records.step_heatmap) > 0 and rep.gpu.kernels.empty
