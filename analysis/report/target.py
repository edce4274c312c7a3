"""Where a report may be written: never over a user's files, never over the run it describes.

``Report.write(out)`` replaces ``out`` whole (``analysis/report/result.py``). That is only safe
in three kinds of folder, so ``problem(out, source)`` refuses every other:

- a folder that does not exist yet (it is made), or an empty one;
- a previous meshscope report: a folder holding ``summary.json`` or the report's ``.cache/``
  (what else it holds — exports, notes — is carried into the new report, and a write killed
  half-way puts it back: ``restore``);
- not the analysed folder itself, nor a folder that holds it, nor a folder inside it other than
  its own ``report/`` (``analyze RUN --out RUN`` would replace run.json, the traces, the Flight
  Recorder dumps).

A folder of anyone's files is refused with one line naming it and how many entries it holds,
before any work is done (``meshscope analyze`` exits 2).
"""
from __future__ import annotations

import os
import pathlib

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
    if not names or rd.SUMMARY in names or rd.CACHE in names:
        return None
    return (f"holds {len(names)} entr{'y' if len(names) == 1 else 'ies'} and no meshscope "
            f"report; a report is written only into a new or empty folder, or over a previous "
            f"report (--out DIR)")


def own_names() -> set[str]:
    """The names of a report's own files: summary.json and one parquet file per table."""
    from meshscope.analysis.report import tables

    return {rd.SUMMARY} | {f"{name}.parquet" for name in tables.NAMES}


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
