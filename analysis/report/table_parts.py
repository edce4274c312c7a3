"""Report tables kept on disk in parts from the stage that makes them until they are written,
so that the analysing process does not hold every rank's rows of them at once (issue 51).

The largest tables of a report have a row per collective instance and rank — the instance
table and its bandwidth table, ~250 B a row each, ~16,000 rows a rank of a 1.73M-event GPU
trace — and used to stay in pandas, all of them together, from the cross-rank stage to the
write: the analysing process grew ~2 MB a rank of the 216k-event reference trace
(docs/benchmarks.md, "Many big ranks"). A ``TableParts`` is one such table as parts on disk
(pandas frames, pickled by this process in its own private folder: ``spill.RankStore``),
appended as they are made; the report holds the handle, not the rows.

- ``frame()`` reads the whole table back (what ``report.comm.bandwidth`` gives a notebook or a
  test: ``report/tables.py`` reads a group's field through it), ``parts()`` one part at a time
  (what a later stage computes on: the bandwidth summary).
- ``crash_safe`` writes it by streaming (``write_parquet``): a table of at most
  ``ROWS_PER_GROUP`` rows is put together and written as before (the same bytes: one row
  group), a larger one a row group of about ``ROWS_PER_GROUP`` rows at a time through
  ``pyarrow.parquet.ParquetWriter`` — the same content, schema and pandas metadata as the
  whole table written at once (``pyarrow.Table.equals``), in several row groups. Parts whose
  columns' types disagree (which pandas would reconcile when putting them together) are
  written whole, as before.

The folder lives as long as a table of it does (``weakref.finalize``), under the report's
cache (``.tmp-<pid>-…``, removed by a later run when this one is killed) or the system's
temporary folder.
"""
from __future__ import annotations

import json
import pathlib
import weakref
from typing import Callable, Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from meshscope.analysis.report import spill

# Rows of a table written as one row group: a table up to this size is written whole, as it
# was before tables were kept in parts; a larger one holds this many rows in pandas at a time
# when it is written (~16 MB of the instance table).
ROWS_PER_GROUP = 65_536


class PartStore:
    """The private folder of one analysis' tables in parts (``spill.RankStore``), removed
    once no table of it is left."""

    def __init__(self, parent: pathlib.Path | None = None):
        self._store = spill.RankStore(parent)
        self._finalizer = weakref.finalize(self, self._store.close)
        self._count = 0

    def table(self, name: str, columns: list[str]) -> TableParts:
        """A new, empty table ``name`` with ``columns`` (those of an empty table)."""
        self._count += 1
        return TableParts(self, f"table{self._count}", columns)

    def cut(self, name: str, columns: list[str], rows: int,
            empty: pd.DataFrame | None = None) -> Cut:
        """A new table ``name`` made of frames as they come, kept in parts of ``rows`` rows
        (``Cut``); without rows, it is ``empty`` (a frame of ``columns`` when not given)."""
        table = self.table(name, columns)
        table.append(pd.DataFrame(columns=columns) if empty is None else empty)
        return Cut(table, rows, columns)

    def close(self) -> None:
        self._finalizer()


class TableParts:
    """One table of the report as parts on disk, in the order they were appended (module
    docstring)."""

    def __init__(self, store: PartStore, key: str, columns: list[str]):
        self._store = store              # kept alive (and its folder) while the table is
        self._key = key
        self._columns = list(columns)
        self._parts = 0
        self.rows = 0
        self._empty: pd.DataFrame | None = None     # the table without rows, as made

    def append(self, part: pd.DataFrame) -> None:
        """``part``'s rows after those appended before (an empty part adds no rows: it is
        the table ``frame()`` gives while none has, its columns' types as made)."""
        if not len(part):
            if self._empty is None:
                # A copy: an empty slice is a view that keeps the whole table it was cut from
                # alive (``_in_parts`` gives ``table.iloc[:0]``), as instance_blocks found.
                self._empty = part.iloc[:0].copy()
            return
        self._store._store.write((self._key, self._parts), part)
        self._parts += 1
        self.rows += len(part)

    def parts(self) -> Iterator[pd.DataFrame]:
        """Each part in turn, read back from its file."""
        for i in range(self._parts):
            yield self._store._store.read((self._key, i))

    def frame(self) -> pd.DataFrame:
        """The whole table (with its columns when it has no rows)."""
        if not self._parts:
            return self._empty if self._empty is not None else \
                pd.DataFrame(columns=self._columns)
        return pd.concat(list(self.parts()), ignore_index=True)


class Cut:
    """Frames appended to ``table`` as parts of exactly ``rows`` rows each (the last one
    fewer): the parts the frames put together (``pd.concat``) and cut every ``rows`` rows
    would make, without the whole table held at once — what a stage that makes a table a rank
    at a time keeps on disk as it goes (the memory curve, issue 51). ``close()`` appends the
    rows left; an empty or None frame adds none."""

    def __init__(self, table: TableParts, rows: int, columns: list[str]):
        self._table = table
        self._rows = rows
        self._columns = list(columns)
        self._held: list[pd.DataFrame] = []
        self._count = 0

    def add(self, frame: pd.DataFrame | None) -> None:
        if frame is None or not len(frame):
            return
        self._held.append(frame)
        self._count += len(frame)
        if self._count >= self._rows:
            self._flush(whole_parts_only=True)

    def close(self) -> TableParts:
        """The table, with every row appended."""
        if self._held:
            self._flush(whole_parts_only=False)
        return self._table

    def _flush(self, whole_parts_only: bool) -> None:
        joined = pd.concat(self._held, ignore_index=True).reindex(columns=self._columns)
        self._held = []
        full = len(joined) - len(joined) % self._rows if whole_parts_only else len(joined)
        for start in range(0, full, self._rows):
            self._table.append(joined.iloc[start:start + self._rows])
        if full < len(joined):
            self._held = [joined.iloc[full:].copy()]    # not a view that keeps ``joined``
        self._count = len(joined) - full


def write_parquet(table: TableParts, path: pathlib.Path,
                  prepare: Callable[[pd.DataFrame], pd.DataFrame]) -> None:
    """``table`` as parquet at ``path``, each group of parts made ready by ``prepare`` (the
    registered column order, text for parquet: ``crash_safe``): whole when it has at most
    ``ROWS_PER_GROUP`` rows (the bytes of ``prepare(table.frame()).to_parquet(path,
    index=False)``), else a row group of about that many rows at a time, with the schema and
    pandas metadata the whole table would have (``_whole_schema``)."""
    schema = None if table.rows <= ROWS_PER_GROUP else \
        _whole_schema([pa.Schema.from_pandas(prepare(p), preserve_index=False)
                       for p in table.parts()])
    if schema is None:
        prepare(table.frame()).to_parquet(path, index=False)
        return
    with pq.ParquetWriter(path, schema) as writer:
        for group in _groups(table.parts()):
            arrow = pa.Table.from_pandas(prepare(group), schema=schema, preserve_index=False)
            writer.write_table(arrow)
            del arrow, group


def _groups(parts: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """Consecutive parts put together into frames of at least ``ROWS_PER_GROUP`` rows (the
    last one fewer)."""
    held: list[pd.DataFrame] = []
    rows = 0
    for p in parts:
        held.append(p)
        rows += len(p)
        if rows >= ROWS_PER_GROUP:
            yield pd.concat(held, ignore_index=True)
            held, rows = [], 0
    if held:
        yield pd.concat(held, ignore_index=True)


def _whole_schema(schemas: list[pa.Schema]) -> pa.Schema | None:
    """The schema pandas gives the parts put together: each column's type and pandas
    metadata the ones its parts agree on (a part whose column of the same dtype has only
    nulls — type null, pandas type ``empty`` — agrees with any). None where they disagree (a
    column of integers in one part and of floats in another, of ``object`` in one and ``str``
    in another: pandas would reconcile them whole), and the table is written whole instead."""
    first = schemas[0]
    meta = json.loads(first.metadata[b"pandas"])
    fields = list(first)
    metas = [json.loads(s.metadata[b"pandas"])["columns"] for s in schemas]
    for s, columns in zip(schemas, metas):
        if s.names != first.names:
            return None
        for i, (other, col) in enumerate(zip(s, columns)):
            if col["numpy_type"] != meta["columns"][i]["numpy_type"]:
                return None         # another dtype: pandas would reconcile them whole
            if pa.types.is_null(other.type):
                continue
            if pa.types.is_null(fields[i].type):
                fields[i], meta["columns"][i] = other, col
            elif other.type != fields[i].type or col != meta["columns"][i]:
                return None
    metadata = dict(first.metadata)
    metadata[b"pandas"] = json.dumps(meta).encode()
    return pa.schema(fields, metadata=metadata)
