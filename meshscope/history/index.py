"""The index of analysed runs: one SQLite file in its own place (docs/history.md).

Every report ``meshscope analyze`` writes, and every folder added by hand (``meshscope index
add``), is registered with what identifies it (``entry.RunEntry``). The file lives at
``--index PATH``, else ``$MESHSCOPE_INDEX``, else ``$XDG_CACHE_HOME/meshscope/index.sqlite``
(``~/.cache/meshscope/index.sqlite``) — never inside a folder meshscope reads: registering only
reads the report (issue 40).

- **Incremental**: a report whose summary.json has the modification time the index holds is
  not read again; ``add`` of one new report is one summary read and one row.
- **Moved or deleted**: ``refresh()`` drops rows whose report is gone; a report added whose
  key (``entry.report_key``: what it was made from) belongs to a row whose folder is gone
  re-points that row (its label kept) instead of adding a second.
- **Versioned**: ``PRAGMA user_version`` is the schema version; ``MIGRATIONS`` brings an older
  file up step by step; a newer file than this code knows is refused (``IndexError_``).

SQLite (the standard library) keeps the registry — small rows, many writers over time, atomic
updates; the reports' own tables are queried in place by DuckDB (``query.py``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import sqlite3
import time

from .entry import EntryError, FindingRow, RunEntry, entry_of, reports_under

SCHEMA_VERSION = 2
ENV_INDEX = "MESHSCOPE_INDEX"
INDEX_FILE = "index.sqlite"

_RUN_COLUMNS = [f.name for f in dataclasses.fields(RunEntry) if f.name != "findings"]

#: Each step from version N to N + 1 (index N). Version 1 held the identity of a run; version
#: 2 added the trust verdict and the framework versions (issue 45's verdict, the traces'
#: NCCL and CUDA runtime), and the findings.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    ("""CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        report_path TEXT NOT NULL UNIQUE, run_path TEXT, report_key TEXT NOT NULL,
        summary_mtime_ns INTEGER NOT NULL, label TEXT, registered_at REAL NOT NULL,
        run_id TEXT, model TEXT, layout TEXT, world_size INTEGER, schedule TEXT,
        device TEXT, device_name TEXT, start_time TEXT, command TEXT, torch_version TEXT,
        step_time_us REAL, step_time_source TEXT, noise_us REAL, window_us REAL,
        tokens_per_s REAL, mfu_pct REAL, ranks INTEGER)""",
     "CREATE INDEX runs_key ON runs(report_key)"),
    ("ALTER TABLE runs ADD COLUMN trust_verdict TEXT",
     "ALTER TABLE runs ADD COLUMN nccl_version TEXT",
     "ALTER TABLE runs ADD COLUMN cuda_runtime TEXT",
     """CREATE TABLE findings (
        run INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        finding TEXT NOT NULL, severity TEXT, dimension TEXT, cost_us REAL, cost_pct REAL,
        title TEXT)""",
     "CREATE INDEX findings_run ON findings(run)"),
)
assert len(MIGRATIONS) == SCHEMA_VERSION


class IndexError_(ValueError):
    """An index file that cannot be used (unreadable, not an index, a newer version); the
    message names the file (commands exit 2)."""


def default_path() -> pathlib.Path:
    """``$MESHSCOPE_INDEX``, else the user's cache folder's ``meshscope/index.sqlite``."""
    if os.environ.get(ENV_INDEX):
        return pathlib.Path(os.environ[ENV_INDEX])
    cache = os.environ.get("XDG_CACHE_HOME") or str(pathlib.Path.home() / ".cache")
    return pathlib.Path(cache) / "meshscope" / INDEX_FILE


@dataclasses.dataclass(frozen=True)
class IndexedRun:
    """A row of the index: the run's entry, its row id and label."""
    id: int
    label: str | None
    entry: RunEntry


@dataclasses.dataclass(frozen=True)
class AddResult:
    """What ``add`` did: reports registered anew, re-read (changed), re-pointed (moved),
    left as they were, and the folders that held no readable report (with why)."""
    added: list[str]
    updated: list[str]
    repointed: list[str]
    unchanged: list[str]
    refused: list[str]


class RunIndex:
    """The index file at ``path`` (module docstring); created on first use."""

    def __init__(self, path: pathlib.Path | None = None, *, create: bool = True):
        self.path = pathlib.Path(path) if path is not None else default_path()
        if not create and not self.path.exists():
            raise IndexError_(f"{self.path}: no index here (meshscope index add FOLDER "
                              f"creates one)")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit: every write is in an explicit ``_writing`` transaction.
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            self._db.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise IndexError_(f"{self.path}: not a usable meshscope index ({e})") from None
        except OSError as e:
            raise IndexError_(f"{self.path}: cannot open the index ({e.strerror or e})") \
                from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "RunIndex":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the schema ------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _newer(self, have: int) -> IndexError_:
        return IndexError_(f"{self.path}: index schema version {have} is newer than this "
                           f"meshscope's ({SCHEMA_VERSION}): upgrade meshscope or use "
                           f"another --index")

    @contextlib.contextmanager
    def _writing(self):
        """One write transaction that holds the file's write lock from its start (BEGIN
        IMMEDIATE): two processes registering at once (two ``analyze`` finishing together)
        wait for each other instead of both reading "absent" and both inserting."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _migrate(self) -> None:
        if self.version > SCHEMA_VERSION:
            raise self._newer(self.version)
        if self.version == SCHEMA_VERSION:
            return
        with self._writing():
            have = self.version                  # again, under the lock
            if have > SCHEMA_VERSION:
                raise self._newer(have)
            for step in range(have, SCHEMA_VERSION):
                for sql in MIGRATIONS[step]:
                    self._db.execute(sql)
                self._db.execute(f"PRAGMA user_version = {step + 1}")

    # -- writing -----------------------------------------------------------------------------
    def _row_of(self, column: str, value: str) -> tuple | None:
        return self._db.execute(f"SELECT id, report_path, summary_mtime_ns FROM runs "
                                f"WHERE {column} = ?", (value,)).fetchone()

    def _write(self, entry: RunEntry, label: str | None, row_id: int | None) -> int:
        values = {c: getattr(entry, c) for c in _RUN_COLUMNS}
        if row_id is None:
            values |= {"label": label, "registered_at": time.time()}
            cols = list(values)
            cur = self._db.execute(
                f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                [values[c] for c in cols])
            row_id = int(cur.lastrowid or 0)
        else:
            if label is not None:
                values["label"] = label
            self._db.execute(f"UPDATE runs SET {', '.join(f'{c} = ?' for c in values)} "
                             f"WHERE id = ?", [*values.values(), row_id])
            self._db.execute("DELETE FROM findings WHERE run = ?", (row_id,))
        self._db.executemany(
            "INSERT INTO findings (run, finding, severity, dimension, cost_us, cost_pct, title)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(row_id, f.finding, f.severity, f.dimension, f.cost_us, f.cost_pct, f.title)
             for f in entry.findings])
        return row_id

    def add(self, folders, label: str | None = None) -> AddResult:
        """Register every report at or under each of ``folders`` (``entry.reports_under``);
        ``label`` set on each (None: kept). A folder with no report is refused, said why."""
        res = AddResult([], [], [], [], [])
        with self._writing():
            for folder in folders:
                folder = pathlib.Path(folder)
                if not folder.is_dir():
                    res.refused.append(f"{folder}: not a folder")
                    continue
                reports = reports_under(folder)
                if not reports:
                    res.refused.append(f"{folder}: holds no report (summary.json); run "
                                       f"meshscope analyze first")
                for report in reports:
                    self._add_one(report, label, res)
        return res

    def _add_one(self, report: pathlib.Path, label: str | None, res: AddResult) -> None:
        path = str(report.resolve())
        row = self._row_of("report_path", path)
        if row is not None and label is None:
            try:
                if (report / "summary.json").stat().st_mtime_ns == row[2]:
                    res.unchanged.append(path)
                    return
            except OSError:
                pass
        try:
            entry = entry_of(report)
        except EntryError as e:
            res.refused.append(str(e))
            return
        if row is not None:
            self._write(entry, label, row[0])
            res.updated.append(path)
            return
        moved = [r for r in self._db.execute(
            "SELECT id, report_path FROM runs WHERE report_key = ?", (entry.report_key,))
            if not pathlib.Path(r[1]).is_dir()]
        if moved:
            self._write(entry, label, moved[0][0])
            res.repointed.append(f"{moved[0][1]} → {path}")
            return
        self._write(entry, label, None)
        res.added.append(path)

    def refresh(self) -> tuple[list[str], list[str]]:
        """Re-read the reports that changed and drop those that are gone; (updated,
        dropped) report paths."""
        updated, dropped = [], []
        with self._writing():
            for row_id, path, mtime in self._db.execute(
                    "SELECT id, report_path, summary_mtime_ns FROM runs").fetchall():
                summary = pathlib.Path(path) / "summary.json"
                try:
                    now = summary.stat().st_mtime_ns
                except OSError:
                    self._db.execute("DELETE FROM runs WHERE id = ?", (row_id,))
                    dropped.append(path)
                    continue
                if now != mtime:
                    try:
                        self._write(entry_of(pathlib.Path(path)), None, row_id)
                        updated.append(path)
                    except EntryError:
                        self._db.execute("DELETE FROM runs WHERE id = ?", (row_id,))
                        dropped.append(path)
        return updated, dropped

    def remove(self, report_paths) -> int:
        """Forget the given reports (their folders are not touched); how many rows went."""
        n = 0
        with self._writing():
            for p in report_paths:
                n += self._db.execute("DELETE FROM runs WHERE report_path = ?",
                                      (str(pathlib.Path(p).resolve()),)).rowcount
        return n

    # -- reading -----------------------------------------------------------------------------
    def runs(self) -> list[IndexedRun]:
        """Every registered run, in registration order."""
        cols = ["id", "label", *_RUN_COLUMNS]
        rows = self._db.execute(f"SELECT {', '.join(cols)} FROM runs ORDER BY id").fetchall()
        finds: dict[int, list[FindingRow]] = {}
        for run, *f in self._db.execute(
                "SELECT run, finding, severity, dimension, cost_us, cost_pct, title "
                "FROM findings ORDER BY rowid"):
            finds.setdefault(run, []).append(FindingRow(*f))
        out = []
        for row in rows:
            d = dict(zip(cols, row))
            rid, label = d.pop("id"), d.pop("label")
            out.append(IndexedRun(rid, label, RunEntry(**d, findings=tuple(finds.get(rid, ())))))
        return out

    def columns(self, table: str) -> list[str]:
        return [r[1] for r in self._db.execute(f"PRAGMA table_info({table})")]

    def types(self, table: str) -> dict[str, str]:
        """Each column of ``table`` and its declared SQLite type (TEXT, INTEGER, REAL)."""
        return {r[1]: r[2] for r in self._db.execute(f"PRAGMA table_info({table})")}

    def rows(self, table: str) -> tuple[list[str], list[tuple]]:
        """A whole table of the index (``runs`` or ``findings``): its columns and rows."""
        cur = self._db.execute(f"SELECT * FROM {table}")
        return [d[0] for d in cur.description], cur.fetchall()


def register_report(report: pathlib.Path, index_path: pathlib.Path | None = None) -> str | None:
    """Register one report just written (``meshscope analyze``); None when done, else why it
    could not be (the analysis is not failed for it: the caller says it as a note)."""
    try:
        with RunIndex(index_path) as idx:
            res = idx.add([report])
    except IndexError_ as e:
        return str(e)
    except (sqlite3.Error, OSError, RuntimeError) as e:   # RuntimeError: no home folder
        return f"{index_path or 'the index'}: {e}"
    return "; ".join(res.refused) or None
