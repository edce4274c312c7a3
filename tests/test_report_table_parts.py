"""The report's tables of a row per collective instance and rank kept on disk in parts from the
stage that makes them to the write (``report/table_parts.py``, issue 51 item 1):

- a table written in parts (several row groups) reads back with the content, schema and pandas
  metadata of the same table written whole — a first part whose text column is all null
  included — through pyarrow and the report's reader; a table of at most ``ROWS_PER_GROUP``
  rows is written whole, the same bytes as before;
- after ``analyze`` the analysing process holds no instance or bandwidth table in pandas: the
  report holds their parts (counted among the live objects on a small synthetic run), and the
  report written from parts of a few rows each equals the one written with the default parts;
- frames appended a rank at a time (``Cut``: the memory curve) become the parts the whole
  table cut every so many rows would be.
"""
from __future__ import annotations

import gc
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from conftest import ROOT
from meshscope.analysis.comm import matching
from meshscope.analysis.report import analyze as analyze_mod
from meshscope.analysis.report import crash_safe, reader, table_parts
from meshscope.analysis.report import tables as report_tables


def _instances(first: int, rows: int, *, named: bool) -> pd.DataFrame:
    """Instance-like rows ``first`` … ``first + rows - 1``: ints, floats with NaN, nullable
    ints, shared text ids (``matching.WRITTEN_AS_TEXT``), lists, and a text column all null
    unless ``named``."""
    ids = [f"0,1|seq={i // 2}" for i in range(first, first + rows)]
    shared = {m: m for m in ids}
    return pd.DataFrame({
        "rank": [i % 2 for i in range(first, first + rows)],
        "arrival_us": [float(i) if i % 5 else float("nan") for i in range(first, first + rows)],
        "seq": pd.array([i if i % 3 else None for i in range(first, first + rows)],
                        dtype="Int64"),
        "pg_name": pd.Series([f"pg{i % 4}" if named else None
                              for i in range(first, first + rows)], dtype=object),
        "match_id": pd.Series([shared[m] for m in ids], dtype=object),
        "ranks_seen": [[i, i + 1] for i in range(first, first + rows)]})


def _prepare(df: pd.DataFrame) -> pd.DataFrame:
    return crash_safe._parquet_safe(df)


def _parts(tmp_path, frames) -> table_parts.TableParts:
    store = table_parts.PartStore(tmp_path)
    t = store.table("t", list(frames[0].columns))
    for f in frames:
        t.append(f)
    return t


def test_a_table_written_in_row_groups_reads_back_as_the_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(table_parts, "ROWS_PER_GROUP", 40)
    frames = [_instances(0, 30, named=False), _instances(30, 30, named=True),
              _instances(60, 25, named=True)]
    whole = pd.concat(frames, ignore_index=True)
    _prepare(whole).to_parquet(tmp_path / "whole.parquet", index=False)
    table_parts.write_parquet(_parts(tmp_path, frames), tmp_path / "parts.parquet", _prepare)
    streamed = pq.ParquetFile(tmp_path / "parts.parquet")
    assert streamed.metadata.num_row_groups == 2          # 60 rows, then the last 25
    assert streamed.metadata.num_rows == 85
    one = pq.read_table(tmp_path / "whole.parquet")
    assert pq.ParquetFile(tmp_path / "whole.parquet").metadata.num_row_groups == 1
    assert streamed.read().equals(one, check_metadata=True)
    assert streamed.schema_arrow.field("pg_name").type == "string"   # not null: the first part's
    back = pd.read_parquet(tmp_path / "parts.parquet")
    pd.testing.assert_frame_equal(back, pd.read_parquet(tmp_path / "whole.parquet"))
    assert back["seq"].dtype == "Int64" and back["match_id"].iloc[-1] == "0,1|seq=42"


def test_a_small_table_is_written_whole_byte_for_byte(tmp_path):
    frames = [_instances(0, 30, named=False), _instances(30, 30, named=True)]
    whole = pd.concat(frames, ignore_index=True)
    _prepare(whole).to_parquet(tmp_path / "whole.parquet", index=False)
    table_parts.write_parquet(_parts(tmp_path, frames), tmp_path / "parts.parquet", _prepare)
    assert (tmp_path / "parts.parquet").read_bytes() == (tmp_path / "whole.parquet").read_bytes()


def test_parts_that_disagree_on_a_column_type_are_written_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(table_parts, "ROWS_PER_GROUP", 10)
    a = pd.DataFrame({"rank": [0] * 20, "bytes": [1] * 20, "dim": [None] * 20})
    b = pd.DataFrame({"rank": [1] * 20, "bytes": [1.5] * 20, "dim": ["dp"] * 20})
    c = pd.DataFrame({"rank": [2] * 20, "bytes": [1.5] * 20, "dim": [None] * 20})
    assert (a["dim"].dtype, b["dim"].dtype) == ("object", "str")
    for parts in ([a, b], [b, c]):      # int64 then float64; object-null then str
        table_parts.write_parquet(_parts(tmp_path, parts), tmp_path / "x.parquet", _prepare)
        _prepare(pd.concat(parts, ignore_index=True)).to_parquet(tmp_path / "w.parquet",
                                                                 index=False)
        assert (tmp_path / "x.parquet").read_bytes() == (tmp_path / "w.parquet").read_bytes()
        assert pq.ParquetFile(tmp_path / "x.parquet").metadata.num_row_groups == 1


def test_parts_read_back_one_by_one_and_whole(tmp_path):
    frames = [_instances(0, 7, named=False), _instances(7, 5, named=True)]
    t = _parts(tmp_path, frames)
    t.append(frames[0].iloc[:0])                       # an empty part adds no rows
    assert t.rows == 12
    pd.testing.assert_frame_equal(t.frame(), pd.concat(frames, ignore_index=True))
    for got, made in zip(t.parts(), frames, strict=True):
        pd.testing.assert_frame_equal(got, made)
    empty = table_parts.PartStore(tmp_path).table("e", ["a", "b"])
    assert list(empty.frame().columns) == ["a", "b"] and empty.rows == 0


def test_the_folder_goes_with_its_last_table(tmp_path):
    store = table_parts.PartStore(tmp_path)
    t = store.table("t", ["rank"])
    t.append(pd.DataFrame({"rank": [1, 2]}))
    folder = store._store.dir
    assert folder is not None and any(folder.iterdir())
    del store
    gc.collect()
    assert folder.is_dir()                      # the table still holds it
    del t
    gc.collect()
    assert not folder.exists()


def test_frames_cut_as_they_come_are_the_parts_of_the_whole_table(tmp_path):
    # A rank's memory curve at a time (issue 51): frames of 0, 7, 13, 1 and 9 rows (and a
    # None), cut into parts of 10 rows, are the 30 rows in order as parts of 10, 10, 10 —
    # what the 30 rows put together (the frames with rows, as the memory tables were
    # joined) and cut every 10 rows give — and read back equal.
    sizes = [0, 7, 13, 1, 9]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    frames = [_instances(a, n, named=True) for a, n in zip(starts, sizes)]
    whole = pd.concat([f for f in frames if len(f)], ignore_index=True)
    store = table_parts.PartStore(tmp_path)
    table = store.table("t", list(whole.columns))
    cut = table_parts.Cut(table, 10, list(whole.columns))
    for f in frames[:2] + [None] + frames[2:]:
        cut.add(f)
    assert cut.close() is table
    assert [len(p) for p in table.parts()] == [10, 10, 10]
    for part, start in zip(table.parts(), (0, 10, 20)):
        pd.testing.assert_frame_equal(part.reset_index(drop=True),
                                      whole.iloc[start:start + 10].reset_index(drop=True))
    pd.testing.assert_frame_equal(table.frame(), whole)


# A small synthetic pipeline run, analysed with the default parts and with parts (and row
# groups) of a few rows each.
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    sys.path.insert(0, str(ROOT))
    from bench.synth import make_run

    return make_run(tmp_path_factory.mktemp("parts") / "run", ranks=4, steps=3,
                    events_per_step=300, layout="dp=2,pp=2", workers=1)


PER_INSTANCE = ("instances", "bandwidth")


@pytest.fixture(scope="module")
def written(run, tmp_path_factory):
    """(report dir with the default parts, report dir with parts of 20 rows written in row
    groups of two parts, the rows of the instance table, the DataFrames of that many rows
    with a match id alive after the analysis, the tables as the report holds them)."""
    out = tmp_path_factory.mktemp("reports")
    report = analyze_mod.analyze(run, workers=1)
    rows = report.comm.instances.shape[0]
    report.write(out / "default")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(analyze_mod, "ROWS_PER_PART", 20)
        mp.setattr(table_parts, "ROWS_PER_GROUP", 30)
        small = analyze_mod.analyze(run, workers=1)
        gc.collect()
        whole_frames = [o for o in gc.get_objects() if isinstance(o, pd.DataFrame)
                        and "match_id" in o.columns and len(o) == rows]
        stored = {name: t for group in (small.steps, small.comm, small.gpu, small.memory)
                  for name, t in group.stored()}
        small.write(out / "parts")
    return out / "default", out / "parts", rows, whole_frames, stored


def test_the_report_holds_per_instance_tables_in_parts_not_in_pandas(written):
    _, _, rows, whole_frames, stored = written
    assert rows > 60                                # several parts of 20 rows
    for name in PER_INSTANCE:
        assert isinstance(stored[name], table_parts.TableParts)
        assert stored[name].rows == rows
    for name in ("timeline", "operator_totals", "memory_curve", "kernel_totals"):
        assert isinstance(stored[name], table_parts.TableParts), name
    assert whole_frames == []                       # no instance or bandwidth table alive
    assert isinstance(stored["collectives"], pd.DataFrame)     # a row per instance, kept


def test_a_report_written_from_small_parts_equals_the_default(written):
    default, parts, rows, _, stored = written
    for name in report_tables.NAMES:
        a, b = default / f"{name}.parquet", parts / f"{name}.parquet"
        assert pq.read_table(b).equals(pq.read_table(a), check_metadata=True), name
        groups = pq.ParquetFile(b).metadata.num_row_groups
        held = stored.get(name)
        if isinstance(held, table_parts.TableParts) and held.rows > 30:
            assert groups == -(-held.rows // 40), name        # two parts of 20 a group
        else:
            assert groups == 1, name
        pd.testing.assert_frame_equal(reader.read_table(parts, name),
                                      reader.read_table(default, name))
    assert "match_id" in matching.WRITTEN_AS_TEXT    # the shared ids went out as text
    ids = pq.read_table(parts / "instances.parquet").schema.field("match_id").type
    assert str(ids) in ("string", "large_string")


def test_an_empty_part_keeps_nothing_of_the_table_it_was_cut_from(tmp_path):
    # ``_in_parts`` appends ``table.iloc[:0]`` first: a view of the table's columns, which
    # kept the whole table alive as long as its parts (to the write), until it was copied.
    import tracemalloc

    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t = pd.DataFrame({"rank": np.arange(1 << 20), "bytes": np.ones(1 << 20)})
    made = tracemalloc.get_traced_memory()[0] - base
    parts = table_parts.PartStore(tmp_path).table("t", ["rank", "bytes"])
    parts.append(t.iloc[:0])
    del t
    gc.collect()
    left = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert made >= 16 << 20 and left < made / 10, (made, left)
    assert parts.rows == 0
    assert parts.frame().dtypes.to_dict() == {"rank": np.dtype("int64"),
                                              "bytes": np.dtype("float64")}
