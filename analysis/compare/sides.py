"""One side of a comparison: an analysed run, whatever was given.

``meshscope compare`` takes anything ``meshscope analyze`` takes — a run directory, a folder of
anyone's Kineto traces — and analysed report directories. ``open_side(path, …)`` returns a
``Side``: the report directory, its summary (``reader.Summary``), run.json where there is one,
and its tables read on demand through ``reader.read_table`` (each at most once). A path that
is not a report is analysed first with the options given (the same as ``analyze``'s), its
report written where ``analyze`` would write it (``PATH/report``) or under ``reports_dir``;
a report whose inputs and options are unchanged is reused (``analysis/report/ensure.py``), and
so is a report that carries no reuse key at all (the shipped samples, a report copied beside
its run): it is read as it is, as the dashboard reads it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import re

import pandas as pd

from meshscope.analysis.errors import InputError
from meshscope.analysis.report import reader
from meshscope.analysis.report.options import AnalysisOptions
from meshscope.collectors.run_dir import REPORT, SUMMARY, ReportDir, RunDirError
from meshscope.collectors.run_info import RunInfo
from meshscope.collectors.run_json import read_run_info


class CompareError(ValueError):
    """Something to compare that cannot be read or analysed; the message names the path and
    the problem (the command prints it and exits 2)."""


@dataclasses.dataclass
class Side:
    """An analysed run (module docstring). ``name`` is how the comparison names it."""
    name: str
    path: pathlib.Path
    report_dir: pathlib.Path
    summary: reader.Summary
    info: RunInfo | None
    _tables: dict[str, pd.DataFrame] = dataclasses.field(default_factory=dict, repr=False)

    def table(self, name: str) -> pd.DataFrame:
        """The report's table ``name`` with its registered columns (``reader.read_table``;
        empty when the report has none); CompareError naming the file when unreadable."""
        if name not in self._tables:
            try:
                self._tables[name] = reader.read_table(self.report_dir, name)
            except reader.ReportError as e:
                raise CompareError(str(e)) from None
        return self._tables[name]

    def has_table(self, name: str) -> bool:
        """Whether the report wrote ``name`` at all (an older report may not have)."""
        return reader.table_written(self.report_dir, name)

    @property
    def ranks(self) -> list[int]:
        return list(self.summary.ranks)

    @property
    def steps(self) -> list[int]:
        """The profiled steps the breakdown holds."""
        bd = self.table("breakdown")
        return sorted(int(s) for s in bd["step"].unique()) if len(bd) else []

    @property
    def on_gpu(self) -> bool:
        return self.summary.device == "gpu"

    @property
    def layout(self) -> str | None:
        return self.info.layout_str if self.info is not None else \
            (self.summary.run_fact("layout_str") if self.summary.run else None)


def is_report_dir(path: pathlib.Path) -> bool:
    """A report directory: it holds summary.json itself (a run directory holds report/)."""
    return (pathlib.Path(path) / SUMMARY).is_file()


def label_of(path: pathlib.Path) -> str:
    """The name a run is shown under: its folder's, and a run's own report folder
    (``RUN/report``) by its run's (``compare A B/report`` calls the candidate ``B``)."""
    path = pathlib.Path(path)
    if path.name == REPORT and is_report_dir(path) and path.parent.name:
        return path.parent.name
    return path.name or str(path)


def _slug(path: pathlib.Path) -> str:
    """A folder name for the report of ``path`` under ``--reports``: its name and a short hash
    of its absolute path (two inputs of one name do not share a report)."""
    full = str(pathlib.Path(path).resolve())
    tag = hashlib.blake2b(full.encode(), digest_size=4).hexdigest()
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', pathlib.Path(path).name) or 'run'}-{tag}"


def report_target(path: pathlib.Path, reports_dir: pathlib.Path | None) -> pathlib.Path:
    """Where the report of ``path`` is kept: ``reports_dir/<name>-<hash>``, else where
    ``meshscope analyze`` writes it (``PATH/report``)."""
    if reports_dir is not None:
        return pathlib.Path(reports_dir) / _slug(path)
    if pathlib.Path(path).is_file():
        raise CompareError(f"{path}: a trace file has no folder of its own for its report: "
                           f"give --reports DIR")
    return ReportDir.of_run(path).path


def _unkeyed_report(report: pathlib.Path) -> bool:
    """A report with its summary but no reuse key (``analysis/report/reuse.py``)."""
    files = ReportDir(report)
    return files.summary.is_file() and not files.key.exists()


def _run_info(folder: pathlib.Path) -> RunInfo | None:
    try:
        return read_run_info(folder)
    except RunDirError as e:
        raise CompareError(str(e)) from None


def open_side(path, *, name: str | None = None, options: AnalysisOptions | None = None,
              baseline_path: str | None = None, reuse: bool = True,
              reports_dir: pathlib.Path | None = None, before_analysis=None) -> Side:
    """The analysed run at ``path`` (module docstring). ``options``: how to analyse a path that
    is not a report yet (default: ``AnalysisOptions()``; its trace cache goes beside the report
    unless ``reuse`` is False, which also computes the report afresh); ``baseline_path``: the
    file ``options.baseline`` was read from (part of the reuse key)."""
    path = pathlib.Path(path)
    if not path.exists():
        raise CompareError(f"{path}: no such file or directory")
    if is_report_dir(path):
        report = path
        try:
            doc = reader.read_summary_file(report)
        except reader.ReportError as e:
            raise CompareError(str(e)) from None
        # A run's own report (RUN/report): run.json is beside it.
        info = _run_info(path.parent) if path.name == REPORT else None
        label = label_of(path)
    elif reuse and _unkeyed_report(report_target(path, reports_dir)):
        # A report nobody keyed (the shipped samples, a report copied with its run): used as
        # it is, as the dashboard does; ``analyze`` or ``--no-cache`` makes it anew.
        report = report_target(path, reports_dir)
        try:
            doc = reader.read_summary_file(report)
        except reader.ReportError as e:
            raise CompareError(str(e)) from None
        info = _run_info(path) if path.is_dir() else None
        label = path.name
    else:
        from meshscope.analysis.report.ensure import analysed

        report = report_target(path, reports_dir)
        opts = options if options is not None else AnalysisOptions()
        opts = dataclasses.replace(opts, cache_dir=ReportDir(report).cache if reuse else None)
        try:
            doc = analysed(path, report, opts, baseline_path=baseline_path, reuse_report=reuse,
                           before_analysis=before_analysis).summary
        except (InputError, RunDirError) as e:
            raise CompareError(f"{path}: cannot be analysed ({e})") from None
        except OSError as e:
            raise CompareError(f"{report}: cannot write the report of {path} "
                               f"({e.strerror or e}); give --reports DIR") from None
        info = _run_info(path) if path.is_dir() else None
        label = path.name
    try:
        typed = reader.read_summary(doc)
    except reader.ReportError as e:
        raise CompareError(f"{report}: {e}") from None
    if typed.step_time.us is None and not typed.per_rank_mean:
        raise CompareError(f"{report}: the report holds no step time and no per-rank "
                           f"breakdown (no usable trace, no step timers): nothing to compare")
    return Side(name=name or label, path=path, report_dir=pathlib.Path(report),
                summary=typed, info=info)


def open_sides(paths, **kw) -> list[Side]:
    """``open_side`` of each path, named so that no two share a name (a repeated folder name
    gets its parent's: ``a/run``, ``b/run``)."""
    paths = [pathlib.Path(p) for p in paths]
    sides = [open_side(p, **kw) for p in paths]
    names = [s.name for s in sides]
    for s, p in zip(sides, paths):
        if names.count(s.name) > 1:
            where = p.resolve().parent if s.name == p.name else p.resolve().parent.parent
            s.name = f"{where.name}/{s.name}"
    return sides
