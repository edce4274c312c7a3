"""The dashboard's data layer: an analysed run's written report, read through the analysis' own
reader, and nothing computed twice.

``open_report(entry)`` returns a ``RunReport``: ``typed`` (summary.json read through
``analysis.report.reader``: a typed ``Summary`` whatever the schema version), ``summary`` (the
document as written, docs/report-format.md), ``table(name)`` — any report table by its file name
(``breakdown``, ``whatif``, ``instances``…), read by ``reader.read_table``: always with the
columns ``analysis/report/tables.py`` registers for it, an older report's missing columns (and
missing tables) added empty there and nowhere else —, ``has_table(name)`` (whether the report
wrote that table at all: an older report may not have) and the typed run.json (``run_info``)
for the mesh. Every table is read when the report is opened, so a damaged one makes the whole
report unreadable at once rather than one page. Reports are cached per run and re-read when
summary.json changes (a re-analysed run shows its new report without a restart); the cache
holds at most ``CACHE_BYTES``, least recently used reports dropped first.

Anything wrong with a report — a missing or damaged file, a key of the wrong type — is a
``ReportUnreadable`` whose message the pages never show: they say "report unreadable, run
``meshscope analyze RUN``" and the server log gets the details.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import pathlib
import re
import threading

import pandas as pd

from meshscope.analysis.report import reader, tables
from meshscope.collectors.run_dir import ReportDir, RunDirError
from meshscope.collectors.run_info import RunInfo
from meshscope.collectors.run_json import read_run_info

from .runs import RunEntry

log = logging.getLogger("meshscope.dashboard")


class ReportUnreadable(Exception):
    """A report that cannot be shown; the message is for the server log only."""


@dataclasses.dataclass
class RunReport:
    entry: RunEntry
    summary: dict
    tables: dict[str, pd.DataFrame]
    written: frozenset[str]           # the tables the report has a file for
    run_info: RunInfo | None
    mtime_ns: int

    @property
    def run_id(self) -> str:
        return self.entry.run_id

    @functools.cached_property
    def typed(self) -> reader.Summary:
        """summary.json read once through ``analysis.report.reader`` (every schema version):
        the pages read the report through this, never with chained ``.get``."""
        return reader.read_summary(self.summary)

    @property
    def schema_version(self) -> int:
        return self.typed.schema_version

    @property
    def ranks(self) -> list[int]:
        return self.typed.ranks

    @property
    def steps(self) -> list[int]:
        return self.typed.steps

    @property
    def report_dir(self) -> pathlib.Path:
        return self.entry.report_dir

    def table(self, name: str) -> pd.DataFrame:
        """The report's ``name.parquet`` with its registered columns (``reader.read_table``):
        an empty frame with them when this report has no such table. Every registered table
        is read when the report is opened (``open_report``); another name is a ValueError."""
        try:
            return self.tables[name]
        except KeyError:
            raise ValueError(f"{name}: not a report table (analysis/report/tables.py)") from None

    def has_table(self, name: str) -> bool:
        """Whether the report wrote ``name.parquet`` (an older report may lack it)."""
        return name in self.written


# The report cache: least recently used reports go first once the reports held weigh more
# than CACHE_BYTES (the tables' memory, as pandas counts it, and summary.json's size on disk
# twice over for its parsed form); the report just read is always kept. ``meshscope dashboard
# --report-cache-mb`` sets it.
CACHE_BYTES = 256 << 20
_CACHE: collections.OrderedDict[str, RunReport] = collections.OrderedDict()
_WEIGHT: dict[str, int] = {}    # run id -> bytes
_LOCK = threading.Lock()


def _weight(report: RunReport, summary_bytes: int) -> int:
    return 2 * summary_bytes + sum(int(t.memory_usage(index=True, deep=True).sum())
                                   for t in report.tables.values())


def _keep(run_id: str, report: RunReport, summary_bytes: int) -> None:
    """Cache ``report`` and drop the least recently used ones past ``CACHE_BYTES`` (under
    ``_LOCK``)."""
    _CACHE[run_id] = report
    _CACHE.move_to_end(run_id)
    _WEIGHT[run_id] = _weight(report, summary_bytes)
    _evict()


def _evict() -> None:
    while len(_CACHE) > 1 and sum(_WEIGHT.values()) > CACHE_BYTES:
        old, _ = _CACHE.popitem(last=False)
        _WEIGHT.pop(old, None)


def _run_locations(summary: dict, entry: RunEntry) -> list[str]:
    """The spellings of the run's location a report may hold, longest first: its absolute
    path (resolved or not) and summary.json's ``source`` — the path ``meshscope analyze`` was
    given, relative to whatever folder it ran in (``../runs/RUN``, ``main/samples/RUN``)."""
    found = {str(entry.path), str(entry.path.resolve())}
    source = summary.get("source")      # read before the typed summary: the rewrite comes first
    if isinstance(source, str) and source.rstrip("/") and \
            pathlib.PurePath(source.rstrip("/")).name == entry.path.name:
        found.add(source.rstrip("/"))
    found.discard(entry.run_id)
    return sorted(found, key=len, reverse=True)


def _without_server_paths(node, where: list[str], run_id: str):
    """``node`` (summary.json) with the run's location (``_run_locations``) replaced by its
    run id, so that a report written by ``meshscope analyze /abs/path/RUN`` or from another
    folder shows ``RUN/traces/…`` like one the dashboard analysed: pages and exports show
    paths relative to the runs folder only."""
    if isinstance(node, dict):
        return {k: _without_server_paths(v, where, run_id) for k, v in node.items()}
    if isinstance(node, list):
        return [_without_server_paths(v, where, run_id) for v in node]
    if isinstance(node, str):
        for w in where:
            if w in node:
                node = re.sub(re.escape(w) + r"(?=/|$|[\s:'\"),;])", run_id, node)
    return node


def open_report(entry: RunEntry) -> RunReport:
    """The written report of an analysed run (module docstring); ReportUnreadable if it cannot
    be read."""
    summary_path = ReportDir(entry.report_dir).summary
    try:
        st = summary_path.stat()
        mtime = st.st_mtime_ns
    except OSError as e:
        raise ReportUnreadable(f"{summary_path}: {e.strerror}") from e
    with _LOCK:
        hit = _CACHE.get(entry.run_id)
        if hit is not None and hit.mtime_ns == mtime and hit.entry.path == entry.path:
            _CACHE.move_to_end(entry.run_id)
            _evict()
            return hit
    try:
        summary = reader.read_summary_file(entry.report_dir)
        written = frozenset(n for n in tables.NAMES if reader.table_written(entry.report_dir, n))
        frames = {n: reader.read_table(entry.report_dir, n) for n in tables.NAMES}
    except reader.ReportError as e:     # json, pyarrow and OS errors alike: "unreadable"
        raise ReportUnreadable(str(e)) from e
    summary = _without_server_paths(summary, _run_locations(summary, entry), entry.run_id)
    try:
        info = read_run_info(entry.path) if entry.has_run_json else None
    except RunDirError as e:
        log.warning("%s", e)
        info = None
    report = RunReport(entry=entry, summary=summary, tables=frames, written=written,
                       run_info=info, mtime_ns=mtime)
    try:
        _ = report.typed        # read once, here: a page never meets a malformed summary
    except (TypeError, ValueError, KeyError, OverflowError) as e:
        raise ReportUnreadable(f"{summary_path}: {type(e).__name__}: {e}") from e
    with _LOCK:
        _keep(entry.run_id, report, st.st_size)
    return report


def read_summary(entry: RunEntry) -> dict | None:
    """summary.json alone (the runs list reads only this); None when absent or unreadable."""
    try:
        return reader.read_summary_file(entry.report_dir)
    except reader.ReportError:
        return None
