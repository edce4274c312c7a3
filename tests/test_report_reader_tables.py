"""A report's tables are read in one place, ``analysis/report/reader.py`` (``read_table``): every
table comes with the columns ``analysis/report/tables.py`` registers for it, whatever the age of
the report. Older reports are made here by hand from a committed sample's report — a table
without one of its columns, a table renamed as schema 1 named it, a table file gone, a file that
is not parquet — so each answer is known by construction (the column's values as the sample has
them, null where the column was taken away), and every dashboard page builds on them with no
column check of its own."""
from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pandas as pd
import pytest

from meshscope.analysis.report import reader, tables
from meshscope.dashboard import state as st
from meshscope.dashboard.app import BUILDERS
from meshscope.dashboard.data import ReportUnreadable, open_report
from meshscope.dashboard.pages.common import PageContext
from meshscope.dashboard.runs import RunIndex
from meshscope.dashboard.static_report import render_html

ROOT = pathlib.Path(__file__).resolve().parents[1]
SLOW = "dp2-pp2-slow-rank1"
SAMPLE = ROOT / "samples" / SLOW / "report"


@pytest.fixture
def older(tmp_path) -> pathlib.Path:
    """A runs folder holding a copy of the slow-rank sample (traces left behind: the pages read
    the report only); the test rewrites its report into an older one."""
    shutil.copytree(SAMPLE.parent, tmp_path / SLOW,
                    ignore=shutil.ignore_patterns("traces", ".cache"))
    return tmp_path


def _report(runs: pathlib.Path) -> pathlib.Path:
    return runs / SLOW / "report"


def _drop(runs: pathlib.Path, name: str, *columns: str) -> pd.DataFrame:
    """Rewrite ``name.parquet`` without ``columns``; the table as the sample has it."""
    path = _report(runs) / f"{name}.parquet"
    full = pd.read_parquet(path)
    full.drop(columns=list(columns)).to_parquet(path, index=False)
    return full


def _items(runs: pathlib.Path, page: str, **state) -> dict:
    ctx = PageContext(open_report(RunIndex(runs).get(SLOW)),
                      st.ViewState(page=page, runs=(SLOW,), **state))
    return {i.id: i for s in BUILDERS[page](ctx) for i in s.items}


def test_a_table_of_this_version_is_read_as_written():
    """Every value as written; a nullable column (parquet's Int64 msg_bytes…) plain, its
    missing values NaN or None — never pd.NA, which a page cannot compare (issue 35)."""
    for name in tables.NAMES:
        written = pd.read_parquet(SAMPLE / f"{name}.parquet")
        read = reader.read_table(SAMPLE, name)
        assert list(read.columns) == tables.COLUMNS[name]
        pd.testing.assert_frame_equal(read, written, check_dtype=False)
        for col in read.columns:
            dtype = read[col].dtype
            assert not isinstance(dtype, pd.api.extensions.ExtensionDtype) or \
                isinstance(dtype, pd.CategoricalDtype), (name, col, dtype)
            assert (read[col].isna() == written[col].isna()).all(), (name, col)


def test_missing_bytes_read_as_nan_and_compare():
    """A table whose Int64 column has a missing value (an all_to_all of unknown size): the
    reader gives float NaN, which compares False instead of raising."""
    df = pd.DataFrame({"msg_bytes": pd.array([4096, None], dtype="Int64"),
                       "op": pd.array(["all_to_all", None], dtype="string")})
    plain = reader.plain_columns(df)
    assert plain["msg_bytes"].dtype == "float64" and plain["op"].dtype == object
    assert [v == v for v in plain["msg_bytes"]] == [True, False]
    assert plain["op"].tolist() == ["all_to_all", None]
    full = reader.plain_columns(df.dropna())
    assert full["msg_bytes"].dtype == "int64"


def test_a_column_an_older_report_lacks_is_added_empty_in_its_place(older):
    """clock_offsets.parquet without ``applied_us`` and ``source``: the reader gives the
    registered columns in order, the others' values as written, the two taken away null; the
    typed rows read the missing applied offset as 0 (nothing applied) and the stragglers page
    shows them so, with no column check of its own."""
    full = _drop(older, "clock_offsets", "applied_us", "source")
    read = reader.read_table(_report(older), "clock_offsets")
    assert list(read.columns) == tables.COLUMNS["clock_offsets"]
    assert read["applied_us"].isna().all() and read["source"].isna().all()
    pd.testing.assert_series_equal(read["offset_us"], full["offset_us"])
    rows = reader.clock_offsets(read)
    assert [c.rank for c in rows] == sorted(full["rank"])
    assert all(c.applied_us == 0.0 and c.source is None for c in rows)
    assert [c.offset_us for c in rows] == \
        [float(v) for v in full.sort_values("rank")["offset_us"]]
    table = _items(older, "stragglers")["clock-table"]
    assert [r[3] for r in table.rows] == ["0.000 ms"] * len(full)      # applied
    assert [r[4] for r in table.rows] == [""] * len(full)              # from
    assert [r[1] for r in table.rows] == \
        [f"{v / 1e3:.3f} ms" for v in full.sort_values("rank")["offset_us"]]


def test_a_table_an_older_report_never_wrote_is_empty_with_its_columns(older):
    """rank_waits.parquet gone: an empty frame with the registered columns, ``table_written``
    False; the stragglers page draws no waits figure and the dashboard's report says the
    table is not there."""
    (_report(older) / "rank_waits.parquet").unlink()
    read = reader.read_table(_report(older), "rank_waits")
    assert read.empty and list(read.columns) == tables.COLUMNS["rank_waits"]
    assert not reader.table_written(_report(older), "rank_waits")
    assert reader.table_written(_report(older), "whatif")
    report = open_report(RunIndex(older).get(SLOW))
    assert not report.has_table("rank_waits") and report.has_table("whatif")
    assert "waits-graph" not in _items(older, "stragglers")
    assert "saving-graph" in _items(older, "stragglers")     # from summary.json, unchanged


def test_a_column_schema_1_named_otherwise_gets_todays_name(older):
    """bandwidth.parquet with the group's ranks under schema 1's ``group``: read back under
    ``pg_ranks`` with the same values, and the communication page's rank × rank matrix pairs
    the ranks of those groups."""
    path = _report(older) / "bandwidth.parquet"
    full = pd.read_parquet(path)
    full.rename(columns={"pg_ranks": "group"}).to_parquet(path, index=False)
    read = reader.read_table(_report(older), "bandwidth")
    assert list(read.columns) == tables.COLUMNS["bandwidth"]
    assert read["pg_ranks"].tolist() == full["pg_ranks"].tolist()
    matrix = _items(older, "communication")["rank-matrix-graph"].figure
    as_written = _items(SAMPLE.parent.parent, "communication")["rank-matrix-graph"].figure
    for mine, theirs in zip(matrix.data, as_written.data, strict=True):
        assert list(mine.x) == list(theirs.x)
        as_list = lambda z: np.asarray(z, dtype=float).tolist()  # noqa: E731
        assert json.dumps(as_list(mine.z)) == json.dumps(as_list(theirs.z))


def test_flags_an_older_heatmap_lacks_are_not_flags(older):
    """step_heatmap.parquet without ``slow`` and ``profiled``: no step is flagged slow (the
    report says nothing about it), the steps summary.json names as profiled are still
    outlined, and the warm-up step summary.json names is still marked."""
    full = _drop(older, "step_heatmap", "slow", "profiled")
    fig = _items(older, "stragglers")["heatmap-graph"].figure
    assert all(cell == "" for row in fig.data[0].text for cell in row)
    summary = json.loads((_report(older) / "summary.json").read_text())
    profiled = [x for x in fig.data[0].x if "(profiled)" in x]
    assert sorted(int(x.split()[0]) for x in profiled) == sorted(summary["steps"])
    warm = [x for x in fig.data[0].x if "(warm-up)" in x]
    assert sorted(int(x.split()[0]) for x in warm) == \
        sorted(set(full.loc[full["warmup"], "step"]) | set(summary["warmup_steps"]))


def test_an_older_timeline_without_causes_draws_no_arrows(older):
    """timeline.parquet without ``cause`` and ``dim``: every segment is still drawn, the
    communication undivided by dimension, and no wait is charged to anyone (no arrow)."""
    full = _drop(older, "timeline", "cause", "dim")
    step = int(full["step"].min())
    fig = _items(older, "timeline", step=step)["timeline-graph"].figure
    mine = full[full["step"] == step]
    bars = [t for t in fig.data if t.type == "bar"]
    assert {t.name for t in bars} == set(mine["kind"])
    # every segment lies inside a bar of its kind on its rank's lane (the page joins the
    # stretches of one kind closer than a pixel into one bar: dashboard/pages/timeline._drawn)
    drawn = {(t.name, y, b, b + x) for t in bars for y, b, x in zip(t.y, t.base, t.x)}
    for r in mine.itertuples():
        lane = [(a, z) for k, y, a, z in drawn
                if k == r.kind and y.split(" ")[:2] == ["rank", str(r.rank)]]
        assert any(a - 1e-3 <= r.start_us / 1e3 and r.end_us / 1e3 <= z + 1e-3
                   for a, z in lane), (r.rank, r.kind, r.start_us, r.end_us)
    assert not fig.layout.annotations


def test_an_older_microbatch_table_without_chunks_is_chunk_0(older):
    full = _drop(older, "microbatches", "chunk")
    step = int(full["step"].min())
    fig = _items(older, "pipeline", step=step)["gantt-graph"].figure
    bars = [t for t in fig.data if t.type == "bar"]
    assert sum(len(t.x) for t in bars) == int((full["step"] == step).sum())
    assert {c[1] for t in bars for c in t.customdata} == {0}


def test_every_page_builds_on_a_report_whose_every_table_lacks_a_column(older):
    """Each table rewritten without its last registered column: every page and the static
    report build (the reader gives the column back empty)."""
    for name, columns in tables.COLUMNS.items():
        _drop(older, name, columns[-1])
    for page in BUILDERS:
        assert _items(older, page), page
    assert "meshscope report" in render_html(open_report(RunIndex(older).get(SLOW)))


def test_a_file_that_is_not_parquet_is_a_report_error_naming_it(older):
    path = _report(older) / "collectives.parquet"
    path.write_bytes(b"PAR1 not a parquet file")
    with pytest.raises(reader.ReportError, match=r"collectives\.parquet: not readable parquet"):
        reader.read_table(_report(older), "collectives")
    with pytest.raises(ReportUnreadable, match=r"collectives\.parquet"):
        open_report(RunIndex(older).get(SLOW))


def test_a_name_that_is_no_table_is_refused():
    with pytest.raises(ValueError, match="not a report table"):
        reader.read_table(SAMPLE, "summary")


@pytest.mark.parametrize("version,hangs,expected", [
    (1, [], True),          # schema 1: its hangs is the Flight Recorder's answer (none)
    (1, None, False),       # schema 1 without the key: no Flight Recorder read
    (3, [], False),         # schema 2+: the table answers, hangs only repeats it
    (3, [{"verdict": "missing", "detail": "rank 3"}], True),
])
def test_whether_summary_hangs_is_the_verdict_is_decided_by_the_reader(version, hangs,
                                                                       expected):
    doc = {"schema_version": version}
    if hangs is not None:
        doc["hangs"] = hangs
    assert reader.read_summary(doc).hangs_in_summary is expected


def test_a_schema_1_report_without_the_flight_recorder_table_reads_its_hangs(older):
    """Schema 1 wrote no flight_recorder.parquet: its ``hangs`` (empty) says healthy; without
    the key the page says there were no dumps."""
    (_report(older) / "flight_recorder.parquet").unlink()
    path = _report(older) / "summary.json"
    doc = json.loads(path.read_text())
    doc.update(schema_version=1, hangs=[])
    path.write_text(json.dumps(doc))
    assert "fr-healthy" in _items(older, "health")
    doc.pop("hangs")
    path.write_text(json.dumps(doc))
    assert "fr-none" in _items(older, "health")


def test_typed_rows_of_a_hand_made_older_gpu_report(tmp_path):
    """A report folder holding only gemms.parquet and stream_idle.parquet, written before
    ``peak_tflops``/``efficiency`` and ``other_us`` existed: the typed rows carry the written
    values and None for what the report does not know (never 0)."""
    pd.DataFrame({"rank": [0, 0], "op": ["aten::mm", "aten::addmm"],
                  "shapes": ["[[4096, 4096], [4096, 4096]]", None], "dtype": ["float", None],
                  "calls": [2, 1], "flops": [2 * 137.4e9, 1e9], "kernel_us": [20_000.0, 100.0],
                  "tflops": [13.74, 10.0]}).to_parquet(tmp_path / "gemms.parquet")
    pd.DataFrame({"rank": [1], "stream": ["7"], "idle_us": [500.0], "host_wait_us": [300.0],
                  "kernel_wait_us": [200.0]}).to_parquet(tmp_path / "stream_idle.parquet")
    mm, addmm = reader.gemms(reader.read_table(tmp_path, "gemms"))
    assert (mm.op, mm.calls, mm.flops, mm.kernel_us, mm.tflops) == \
        ("aten::mm", 2, 2 * 137.4e9, 20_000.0, 13.74)
    assert mm.shapes == "[[4096, 4096], [4096, 4096]]" and mm.dtype == "float"
    assert mm.peak_tflops is None and mm.efficiency is None
    assert addmm.shapes is None and addmm.dtype is None
    (s,) = reader.stream_idle(reader.read_table(tmp_path, "stream_idle"))
    assert (s.rank, s.stream, s.idle_us, s.host_wait_us, s.kernel_wait_us, s.other_us) == \
        (1, "7", 500.0, 300.0, 200.0, None)
    assert reader.kernels(reader.read_table(tmp_path, "kernels")) == []    # no file: no rows


def test_the_stage_imbalance_rows_are_the_tables():
    written = pd.read_parquet(SAMPLE / "stage_imbalance.parquet")
    rows = reader.stage_computes(reader.read_table(SAMPLE, "stage_imbalance"))
    assert [(r.stage, r.compute_per_mb_us, r.ratio_to_mean) for r in rows] == \
        [(int(a), float(b), float(c)) for a, b, c in
         written[["stage", "compute_per_mb_us", "ratio_to_mean"]].itertuples(index=False)]
