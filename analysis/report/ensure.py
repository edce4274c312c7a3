"""A report that is there and current: ``analysed(path, target, options)``.

The one place that decides whether a path's report can be reused or must be computed, for
``meshscope analyze`` and for ``meshscope compare`` (which analyses what it is given, as
``analyze`` would, before comparing): the reuse key of ``analysis/report/reuse.py`` over the
inputs and the options that change numbers (``AnalysisOptions.key_fields``); when it matches
the stored report, that report's summary is returned without importing the analysis; else
the analysis runs (``analyze``), the report is written crash-safe (``Report.write``) and its
key stored last.

One process at a time does this for one report folder (``report_lock.ReportLock``: an exclusive
lock of ``.NAME.lock`` beside it, from the check of its key to the end of the write): runs
started together on one folder take turns — the second waits (saying so on stderr), then
reuses the report the first wrote (its key matches), or writes it again with
``reuse_report=False`` — where they used to break each other's files (issue 46, case 7).
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

from meshscope.analysis.errors import InputError
from meshscope.analysis.report import reuse
from meshscope.analysis.report import target as report_target
from meshscope.analysis.report.options import AnalysisOptions
from meshscope.collectors.report_lock import ReportLock
from meshscope.collectors.run_dir import ReportDir


@dataclasses.dataclass(frozen=True)
class Analysed:
    """A report made or found: its directory, its summary.json document, whether it was the
    stored one (``reused``) and, when computed here, the ``Report`` itself (None when
    reused)."""
    report_dir: pathlib.Path
    summary: dict
    reused: bool
    report: object | None = None


def analysed(path: pathlib.Path, target: pathlib.Path, options: AnalysisOptions, *,
             baseline_path: str | None = None, reuse_report: bool = True,
             before_analysis=None) -> Analysed:
    """The report of ``path`` in ``target`` as ``options`` say: the stored one when its key
    matches (and ``reuse_report``), else computed and written. ``before_analysis()``, when
    given, runs just before the analysis is imported (the command sets the allocator there).
    Raises what the analysis raises for bad input (``InputError``, ``RunDirError``), an
    ``InputError`` for a folder the report may not be written to (``report/target.py``:
    checked before any work), and ``OSError`` when the report cannot be written."""
    path, target = pathlib.Path(path), pathlib.Path(target)
    if not path.exists() and not path.is_symlink():     # before the lock makes its folder
        raise InputError(path, "no such file or directory")
    why = report_target.problem(target, path)
    if why is not None:             # refused before anything is made, the lock included
        raise InputError(target, why)
    with ReportLock(target, on_wait=_waiting(target)):
        why = report_target.problem(target, path)      # as the run it waited for left it
        if why is not None:
            raise InputError(target, why)
        digest = reuse.key(path, target, options.key_fields(baseline_path)) \
            if path.exists() else None
        if digest and reuse_report:
            summary = reuse.cached_summary(target, digest)
            if summary is not None:
                return Analysed(target, summary, True)
        if before_analysis is not None:
            before_analysis()
        from meshscope.analysis.report.analyze import analyze

        report = analyze(path, options)
        report.write(target)
        if digest:
            reuse.store(target, digest)
        summary = json.loads(ReportDir(target).summary.read_text())
    return Analysed(target, summary, False, report)


def _waiting(target: pathlib.Path):
    """What ``analysed`` says when another process is writing ``target``: one line on stderr,
    before it waits for its turn."""
    def say(pid: int | None) -> None:
        who = f" (process {pid})" if pid else ""
        print(f"meshscope: {target}: another meshscope{who} is writing this report; waiting "
              f"for it to finish", file=sys.stderr, flush=True)
    return say
