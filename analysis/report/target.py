"""Where a report may be written: never over a user's files, never over the run it describes.

``Report.write(out)`` replaces ``out`` whole (``analysis/report/result.py``). That is only safe
in three kinds of folder, so ``problem(out, source)`` refuses every other:

- a folder that does not exist yet (it is made), or an empty one;
- a report meshscope wrote: a folder holding its marker, ``.meshscope-report`` (written with
  every report since issue 46; what else the folder holds — exports, notes — is carried into
  the new report, and a write killed half-way puts it back: ``restore``);
- a report written before the marker (by an earlier version): a folder holding nothing but the
  names a report has — ``summary.json`` (a JSON object with an integer ``schema_version``),
  one ``<table>.parquet`` per registered table, and ``.cache/`` holding only the cache's own
  files (the report key, the inputs memo, ``<hash>.parquet`` and ``<hash>.memory.parquet``
  trace copies, the temporary files of a killed write);
- not the analysed folder itself, nor a folder that holds it, nor a folder inside it other than
  its own ``report/`` (``analyze RUN --out RUN`` would replace run.json, the traces, the Flight
  Recorder dumps).

Any other folder — a user's own ``summary.json``, a home folder with ``.cache/pip`` — is
refused before any work is done, with one line naming the entry that made it refuse
(``meshscope analyze`` exits 2): meshscope never writes into a folder it cannot tell is its
own.
"""
from __future__ import annotations

import json
import os
import pathlib
import re

from meshscope.collectors import run_dir as rd


def _inside(a: pathlib.Path, b: pathlib.Path) -> bool:
    """Whether ``a`` is ``b`` or lies under it (paths resolved)."""
    try:
        a.relative_to(b)
        return True
    except ValueError:
        return False


def problem(out: pathlib.Path, source: pathlib.Path | None) -> str | None:
    """Why the report of ``source`` may not be written to ``out`` (module docstring), in words
    that follow ``out``'s name; None when it may."""
    out = pathlib.Path(out)
    full = out.resolve()
    if source is not None:
        src = pathlib.Path(source).resolve()
        own = rd.ReportDir.of_run(src).path.resolve()
        if full == src or (src.is_dir() and _inside(src, full)):
            return (f"the report would replace the folder it analyses ({source}); write it "
                    f"elsewhere (--out DIR)")
        if src.is_dir() and _inside(full, src) and full != own:
            return (f"inside the analysed folder {source}; the report goes to {own} by "
                    f"default, or to a folder outside it (--out DIR)")
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        return "not a folder; write the report into a new or empty folder (--out DIR)"
    if not out.is_dir():
        return None
    try:
        names = os.listdir(out)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if not names or rd.MARKER in names:
        return None
    foreign = _foreign(out, names)
    if foreign is None:
        return None
    return (f"holds {foreign}, which is not a file of a meshscope report ({len(names)} "
            f"entr{'y' if len(names) == 1 else 'ies'} in all); a report is written only into "
            f"a new or empty folder, or over a report meshscope wrote (--out DIR)")


#: What a report's ``.cache/`` holds: the report key, the inputs memo, the trace copies
#: (``ingest/cache.py``: a 40-hex-digit key) and the temporary files a killed write leaves.
_CACHE_NAMES = re.compile(r"(report\.key|inputs\.json|[0-9a-f]{40}(\.memory)?\.parquet"
                          r"|\.tmp-.*|\.report\.key\..*|\.inputs\.json\..*)")


def _foreign(out: pathlib.Path, names: list[str]) -> str | None:
    """The first entry of the unmarked folder ``out`` that a report written before the
    marker would not hold (module docstring), as a path under ``out``; None when there is
    none."""
    own = own_names()
    for name in sorted(names):
        if name == rd.CACHE:
            try:
                inside = sorted(os.listdir(out / name))
            except OSError:
                return f"{name}/ (not a folder meshscope can read)"
            bad = next((n for n in inside if not _CACHE_NAMES.fullmatch(n)), None)
            if bad is not None:
                return f"{name}/{bad}"
        elif name not in own:
            return name
    if rd.SUMMARY in names and not _is_summary(out / rd.SUMMARY):
        return f"{rd.SUMMARY} (not a meshscope summary: no integer schema_version)"
    return None


def _is_summary(path: pathlib.Path) -> bool:
    """Whether ``path`` reads as a meshscope summary.json (an object whose schema_version is
    an integer); a large or unreadable file is not."""
    try:
        if path.stat().st_size > 64 << 20:
            return False
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    return isinstance(version, int) and not isinstance(version, bool)


def marker() -> dict:
    """The marker's content: who wrote the folder, and the summary schema it wrote."""
    from meshscope.analysis.report.model import REPORT_SCHEMA_VERSION

    return {"written_by": "meshscope", "report_schema": REPORT_SCHEMA_VERSION}


def own_names() -> set[str]:
    """The names of a report's own files: summary.json, the marker and one parquet file per
    table."""
    from meshscope.analysis.report import tables

    return {rd.SUMMARY, rd.MARKER} | {f"{name}.parquet" for name in tables.NAMES}


def restore(leftover: pathlib.Path, out: pathlib.Path) -> None:
    """Put back into ``out`` what a killed write had carried from it into the new folder
    ``leftover`` (every entry that is not the report's own and that ``out`` does not hold
    again), so that removing the leftover loses nothing of the user's."""
    if not out.exists() and not out.is_symlink():
        # Killed between the two renames that replace a folder where the system cannot
        # exchange them: the leftover is the whole new report, with what it carried.
        try:
            os.rename(leftover, out)
            return
        except OSError:
            pass
    own = own_names()
    try:
        entries = sorted(leftover.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name in own:
            continue
        target = out / entry.name
        if target.exists() or target.is_symlink():
            continue
        out.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(entry, target)
        except OSError:
            pass
