"""The dashboard's data layer: an analysed run's written report, read through the analysis' own
reader, and nothing computed twice.

``open_report(entry)`` returns a ``RunReport``: ``summary`` (summary.json as written, schema 1 or
2, docs/report-format.md), ``table(name)`` — any report table by its file name
(``breakdown``, ``whatif``, ``instances``…), ``None`` when this report has none — and the typed
run.json (``run_info``) for the mesh. The tables the analysis' reader returns
(``analysis.report.analyze.load_written``) come from it; the others are read from the same
report folder on first use. Reports are cached per run and re-read when summary.json changes (a
re-analysed run shows its new report without a restart).

Anything wrong with a report — a missing or damaged file, a key of the wrong type — is a
``ReportUnreadable`` whose message the pages never show: they say "report unreadable, run
``meshscope analyze RUN``" and the server log gets the details.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import threading

import pandas as pd

from meshscope.analysis.report.analyze import load_written
from meshscope.collectors.run_dir import RunDirError
from meshscope.collectors.run_info import RunInfo, read_run_info

from .runs import RunEntry

log = logging.getLogger("meshscope.dashboard")


class ReportUnreadable(Exception):
    """A report that cannot be shown; the message is for the server log only."""


@dataclasses.dataclass
class RunReport:
    entry: RunEntry
    summary: dict
    tables: dict[str, pd.DataFrame | None]
    run_info: RunInfo | None
    mtime_ns: int

    @property
    def run_id(self) -> str:
        return self.entry.run_id

    @property
    def schema_version(self) -> int:
        v = self.summary.get("schema_version")
        return v if isinstance(v, int) else 0

    @property
    def run(self) -> dict:
        """summary.json's ``run`` (from run.json), ``{}`` for a plain folder of traces."""
        run = self.summary.get("run")
        return run if isinstance(run, dict) else {}

    @property
    def ranks(self) -> list[int]:
        return [int(r) for r in self.summary.get("ranks") or []]

    @property
    def steps(self) -> list[int]:
        return [int(s) for s in self.summary.get("steps") or []]

    def get(self, *keys, default=None):
        """A nested key of summary.json, ``default`` where any level is absent or not a dict."""
        node = self.summary
        for k in keys:
            if not isinstance(node, dict) or k not in node:
                return default
            node = node[k]
        return default if node is None else node

    def table(self, name: str) -> pd.DataFrame | None:
        """The report's ``name.parquet``; None when this report has no such table."""
        if name not in self.tables:
            path = self.entry.report_dir / f"{name}.parquet"
            if not path.is_file():
                self.tables[name] = None
            else:
                try:
                    self.tables[name] = pd.read_parquet(path)
                except Exception as e:  # pyarrow raises several types for a damaged file
                    raise ReportUnreadable(f"{path}: {type(e).__name__}: {e}") from e
        return self.tables[name]

    def has_columns(self, name: str, *columns: str) -> bool:
        t = self.table(name)
        return t is not None and all(c in t.columns for c in columns)


_CACHE: dict[str, RunReport] = {}
_LOCK = threading.Lock()


def open_report(entry: RunEntry) -> RunReport:
    """The written report of an analysed run (module docstring); ReportUnreadable if it cannot
    be read."""
    summary_path = entry.report_dir / "summary.json"
    try:
        mtime = summary_path.stat().st_mtime_ns
    except OSError as e:
        raise ReportUnreadable(f"{summary_path}: {e.strerror}") from e
    with _LOCK:
        hit = _CACHE.get(entry.run_id)
        if hit is not None and hit.mtime_ns == mtime and hit.entry.path == entry.path:
            return hit
    try:
        written = load_written(entry.report_dir)
    except Exception as e:  # json, pyarrow and OS errors alike: the page says "unreadable"
        raise ReportUnreadable(f"{entry.report_dir}: {type(e).__name__}: {e}") from e
    summary = written.pop("summary")
    if not isinstance(summary, dict):
        raise ReportUnreadable(f"{summary_path}: not a JSON object")
    try:
        info = read_run_info(entry.path) if entry.has_run_json else None
    except RunDirError as e:
        log.warning("%s", e)
        info = None
    report = RunReport(entry=entry, summary=summary,
                       tables={k: v for k, v in written.items() if isinstance(v, pd.DataFrame)},
                       run_info=info, mtime_ns=mtime)
    with _LOCK:
        _CACHE[entry.run_id] = report
    return report


def read_summary(entry: RunEntry) -> dict | None:
    """summary.json alone (the runs list reads only this); None when absent or unreadable."""
    try:
        data = json.loads((entry.report_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
