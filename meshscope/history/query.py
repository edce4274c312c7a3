"""SQL over every indexed report, its own files read in place (docs/history.md, "Query").

``query(sql, index)`` answers one SELECT over these views (``VIEWS_VERSION``):

- ``runs``: one row per indexed report (the index's ``runs`` table: ``id``, ``label``,
  ``report_path``, ``model``, ``layout``, ``world_size``, ``device``, ``start_time``,
  ``trust_verdict``, ``step_time_us`` …);
- ``findings``: one row per finding of each report (``run``, ``finding``, ``severity``,
  ``dimension``, ``cost_us``, ``cost_pct``, ``title``);
- one view per report table (``analysis/report/tables.py``: ``breakdown``, ``bandwidth``,
  ``exposed_comm``, ``throughput``, ``memory_steps`` …): every indexed report's parquet file
  of that table, read in place by DuckDB, with ``run`` (``runs.id``) first and the table's own
  columns after it. A view is made only for the tables the SQL names.

The engine is DuckDB, embedded: it reads parquet files where they lie (no copy, no load
step), unions files whose columns differ by name (an older report's table), and can be shut
off from the file system: the connection may read only the indexed reports' files
(``allowed_paths``, ``enable_external_access = false``, the configuration locked), and the
statement must be one SELECT — a query never writes, and never reads outside the reports.
"""
from __future__ import annotations

import pathlib
import re

import pandas as pd

from meshscope.analysis.report.tables import COLUMNS as TABLE_COLUMNS
from meshscope.collectors.run_dir import ReportDir

from .index import RunIndex

VIEWS_VERSION = 1
#: The column of every table view that names its ``runs.id``.
LINK = "run"
#: The DuckDB type of each SQLite column type of the index (its declared types).
_SQL_TYPES = {"TEXT": "VARCHAR", "INTEGER": "BIGINT", "REAL": "DOUBLE"}


class QueryError(ValueError):
    """SQL that cannot be run (not one SELECT, a syntax error, an unknown column); the
    message says which (commands exit 2)."""


def _said(e: Exception) -> str:
    """DuckDB's message on one line (its lines joined; the caret line left out)."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip() and set(x.strip()) != {"^"}]
    return " — ".join(lines)


def _named_tables(sql: str) -> list[str]:
    words = {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", sql)}
    return [t for t in TABLE_COLUMNS if t in words]


def _one_select(con, sql: str):
    import duckdb

    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryError(f"SQL: {_said(e)}") from None
    if len(statements) != 1:
        raise QueryError(f"SQL: give one statement, not {len(statements)}")
    if statements[0].type != duckdb.StatementType.SELECT:
        raise QueryError(f"SQL: only a SELECT is answered (this is "
                         f"{statements[0].type.name}): queries never write")


def _inside(path: str, roots: list[pathlib.Path] | None) -> bool:
    return roots is None or any(pathlib.Path(path).is_relative_to(r) for r in roots)


def connect(index: RunIndex, sql: str = "", within: list[pathlib.Path] | None = None):
    """A DuckDB connection with the views of the module docstring (table views for the
    tables ``sql`` names; all of them when ``sql`` is empty), locked to the reports' files;
    ``within``: only the reports under these folders (resolved) are seen."""
    import duckdb

    con = duckdb.connect(":memory:")
    run_cols, run_rows = index.rows("runs")
    run_rows = [r for r in run_rows if _inside(r[run_cols.index("report_path")], within)]
    kept = {r[run_cols.index("id")] for r in run_rows}
    f_cols, f_rows = index.rows("findings")
    f_rows = [r for r in f_rows if r[f_cols.index("run")] in kept]
    for name, cols, rows in (("runs", run_cols, run_rows), ("findings", f_cols, f_rows)):
        con.register(f"_{name}", pd.DataFrame.from_records(rows, columns=cols))
        types = index.types(name)
        typed = ", ".join(f'CAST("{c}" AS {_SQL_TYPES.get(types[c], "VARCHAR")}) AS "{c}"'
                          for c in cols)
        con.execute(f"CREATE VIEW {name} AS SELECT {typed} FROM _{name}")
    allowed: list[str] = []
    ids = [dict(zip(run_cols, r)) for r in run_rows]
    for table in (_named_tables(sql) if sql else list(TABLE_COLUMNS)):
        files = []
        for row in ids:
            f = ReportDir(pathlib.Path(row["report_path"])).table(table)
            if f.is_file():
                files.append((row["id"], str(f)))
        if not files:
            nulls = ", ".join(f'NULL AS "{c}"' for c in TABLE_COLUMNS[table])
            con.execute(f"CREATE VIEW {table} AS SELECT NULL::BIGINT AS {LINK}, {nulls} "
                        f"WHERE false")
            continue
        con.register(f"_files_{table}",
                     pd.DataFrame.from_records(files, columns=[LINK, "_file"]))
        listed = "[" + ", ".join("'" + f.replace("'", "''") + "'" for _, f in files) + "]"
        con.execute(f"CREATE VIEW {table} AS SELECT m.{LINK}, t.* EXCLUDE (filename) "
                    f"FROM read_parquet({listed}, filename = true, union_by_name = true) t "
                    f"JOIN _files_{table} m ON t.filename = m._file")
        allowed += [f for _, f in files]
    quoted = ", ".join("'" + f.replace("'", "''") + "'" for f in allowed)
    con.execute(f"SET allowed_paths = [{quoted}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def query(sql: str, index: RunIndex, within: list[pathlib.Path] | None = None
          ) -> pd.DataFrame:
    """The answer of one SELECT over the views (module docstring), as a table; ``within``:
    only the reports under these folders."""
    import duckdb

    if not sql or not sql.strip():
        raise QueryError("SQL: empty")
    try:
        con = connect(index, sql, within)
    except duckdb.Error as e:
        raise QueryError(f"a report's table cannot be read: {_said(e)}") from None
    try:
        _one_select(con, sql)
        return con.execute(sql).df()
    except duckdb.Error as e:
        raise QueryError(f"SQL: {_said(e)}") from None
    finally:
        con.close()


def schema(index: RunIndex) -> dict[str, list[tuple[str, str]]]:
    """Each view and its columns with their DuckDB types (``meshscope query --schema``)."""
    con = connect(index)
    try:
        out = {}
        for (name,) in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal "
                                   "AND view_name NOT LIKE '\\_%' ESCAPE '\\' "
                                   "ORDER BY view_name").fetchall():
            out[name] = [(c, t) for c, t in con.execute(
                "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ? "
                "ORDER BY column_index", [name]).fetchall()]
        return out
    finally:
        con.close()
