"""The dashboard's data layer: an analysed run's written report, read through the analysis' own
reader, and nothing computed twice.

``open_report(entry)`` returns a ``RunReport``: ``summary`` (summary.json as written, schema 1 or
2, docs/report-format.md), ``table(name)`` — any report table by its file name
(``breakdown``, ``whatif``, ``instances``…), ``None`` when this report has none — and the typed
run.json (``run_info``) for the mesh. The tables the analysis' reader returns
(``analysis.report.analyze.load_written``) come from it; the others are read from the same
report folder on first use. Reports are cached per run and re-read when summary.json changes (a
re-analysed run shows its new report without a restart); the cache holds at most
``CACHE_BYTES``, least recently used reports dropped first.

Anything wrong with a report — a missing or damaged file, a key of the wrong type — is a
``ReportUnreadable`` whose message the pages never show: they say "report unreadable, run
``meshscope analyze RUN``" and the server log gets the details.
"""
from __future__ import annotations

import collections
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


# The report cache: least recently used reports go first once the reports held weigh more
# than CACHE_BYTES (the tables' memory, as pandas counts it, and summary.json's size on disk
# twice over for its parsed form); the report just read is always kept. ``meshscope dashboard
# --report-cache-mb`` sets it.
CACHE_BYTES = 256 << 20
_CACHE: collections.OrderedDict[str, RunReport] = collections.OrderedDict()
_WEIGHT: dict[str, tuple[int, int]] = {}    # run id -> (tables weighed, bytes)
_LOCK = threading.Lock()


def _weight(report: RunReport, summary_bytes: int) -> int:
    total = 2 * summary_bytes
    for t in list(report.tables.values()):     # a page may be adding one meanwhile
        if isinstance(t, pd.DataFrame):
            total += int(t.memory_usage(index=True, deep=True).sum())
    return total


def _keep(run_id: str, report: RunReport, summary_bytes: int) -> None:
    """Cache ``report`` and drop the least recently used ones past ``CACHE_BYTES`` (under
    ``_LOCK``)."""
    _CACHE[run_id] = report
    _CACHE.move_to_end(run_id)
    _WEIGHT[run_id] = (len(report.tables), _weight(report, summary_bytes))
    _evict()


def _evict() -> None:
    while len(_CACHE) > 1 and sum(w for _, w in _WEIGHT.values()) > CACHE_BYTES:
        old, _ = _CACHE.popitem(last=False)
        _WEIGHT.pop(old, None)


def _without_server_paths(node, entry: RunEntry):
    """``node`` (summary.json) with the run's absolute location replaced by its run id, so a
    report written by ``meshscope analyze /abs/path/RUN`` shows ``RUN/traces/…`` like one the
    dashboard analysed (pages and exports show paths relative to the runs folder only)."""
    if isinstance(node, dict):
        return {k: _without_server_paths(v, entry) for k, v in node.items()}
    if isinstance(node, list):
        return [_without_server_paths(v, entry) for v in node]
    if isinstance(node, str) and str(entry.path) in node:
        return node.replace(str(entry.path), entry.run_id)
    return node


def open_report(entry: RunEntry) -> RunReport:
    """The written report of an analysed run (module docstring); ReportUnreadable if it cannot
    be read."""
    summary_path = entry.report_dir / "summary.json"
    try:
        st = summary_path.stat()
        mtime = st.st_mtime_ns
    except OSError as e:
        raise ReportUnreadable(f"{summary_path}: {e.strerror}") from e
    with _LOCK:
        hit = _CACHE.get(entry.run_id)
        if hit is not None and hit.mtime_ns == mtime and hit.entry.path == entry.path:
            _CACHE.move_to_end(entry.run_id)
            if _WEIGHT.get(entry.run_id, (0, 0))[0] != len(hit.tables):   # tables read since
                _keep(entry.run_id, hit, st.st_size)
            else:
                _evict()
            return hit
    try:
        written = load_written(entry.report_dir)
    except Exception as e:  # json, pyarrow and OS errors alike: the page says "unreadable"
        raise ReportUnreadable(f"{entry.report_dir}: {type(e).__name__}: {e}") from e
    summary = written.pop("summary")
    if not isinstance(summary, dict):
        raise ReportUnreadable(f"{summary_path}: not a JSON object")
    summary = _without_server_paths(summary, entry)
    try:
        info = read_run_info(entry.path) if entry.has_run_json else None
    except RunDirError as e:
        log.warning("%s", e)
        info = None
    report = RunReport(entry=entry, summary=summary,
                       tables={k: v for k, v in written.items() if isinstance(v, pd.DataFrame)},
                       run_info=info, mtime_ns=mtime)
    with _LOCK:
        _keep(entry.run_id, report, st.st_size)
    return report


def read_summary(entry: RunEntry) -> dict | None:
    """summary.json alone (the runs list reads only this); None when absent or unreadable."""
    try:
        data = json.loads((entry.report_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
