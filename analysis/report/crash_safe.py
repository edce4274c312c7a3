"""Writing a report folder so that a crash, a kill or a power loss never leaves a mix.

A reader — the dashboard, ``compare``, a second ``analyze`` — sees the old report or the new
one, whole (``write_folder``); what a killed write leaves beside the folder is cleared by the
next (``remove_leftovers``). The report's tables and summary come from ``analyze.Report``.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import uuid
from typing import Callable, Iterable

import pandas as pd

from meshscope.analysis.errors import InputError
from meshscope.analysis.comm import matching
from meshscope.analysis.ingest import allocator
from meshscope.analysis.report import reuse, spill
from meshscope.analysis.report import target as report_target
from meshscope.analysis.report import table_parts
from meshscope.analysis.report import tables as report_tables
from meshscope.collectors import report_lock
from meshscope.collectors import run_dir as rd

# A table to write: in memory, or on disk in parts (``table_parts``).
Table = pd.DataFrame | table_parts.TableParts


def write_folder(out: pathlib.Path, source: pathlib.Path,
                 tables: Iterable[tuple[str, Table | None]],
                 summary: Callable[[], dict]) -> pathlib.Path:
    """Write a report to ``out`` — each (name, table) of ``tables`` as NAME.parquet in its
    columns' order (``report/tables.py``; None: not written; a table in parts on disk,
    ``table_parts.TableParts``, streamed from its parts), then ``summary()`` as
    summary.json —, crash-safe: first its key is removed (a report that a killed run leaves
    is made again by the next), then the whole report is written to a new hidden folder
    beside ``out``, what else ``out`` holds (the trace cache ``.cache/``, exports) is moved
    into it, and the two folders are exchanged in one rename (``renameat2(RENAME_EXCHANGE)``;
    where it is missing, two renames) — a reader sees the old report or the new one, never a
    mix. The key is written last, by the caller (``reuse.store``). Leftovers of killed writes
    are removed first.

    Durable too, not only atomic: every file of the new folder and the folder itself are
    flushed to disk (``fsync``) before the rename, and the parent folder after it. A rename
    is a change to the parent folder alone; without the flushes, a power loss after it may
    leave the new name pointing at files whose content never reached the disk — a report
    renamed into place but empty.

    One writer at a time: the whole write holds the folder's lock (``report_lock.ReportLock``;
    ``ensure.analysed`` already holds it from before the analysis, and re-enters it here), so
    that no other process moves the folder's ``.cache/`` away under this one, or this one
    under it."""
    out = pathlib.Path(out)
    why = report_target.problem(out, source)
    if why is not None:
        raise InputError(out, why)
    with report_lock.ReportLock(out):
        return _write_folder(out, source, tables, summary)


def _write_folder(out: pathlib.Path, source: pathlib.Path,
                  tables: Iterable[tuple[str, Table | None]],
                  summary: Callable[[], dict]) -> pathlib.Path:
    """``write_folder``, its lock held."""
    why = report_target.problem(out, source)        # as a writer it waited for left it
    if why is not None:
        raise InputError(out, why)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(out)
    reuse.unkey(out)
    new = out.parent / f".{out.name}.new-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    new.mkdir()
    files = rd.ReportDir(new)
    own = [files.summary, files.marker]    # every file this report may hold
    for name, table in tables:
        own.append(files.table(name))
        if isinstance(table, table_parts.TableParts):     # streamed from its parts
            reuse.stop_point()
            table_parts.write_parquet(
                table, files.table(name),
                lambda part, name=name: _parquet_safe(report_tables.ordered(name, part)))
            allocator.trim()
        elif table is not None:
            reuse.stop_point()
            table = report_tables.ordered(name, table)    # its columns, even when empty
            _parquet_safe(table).to_parquet(files.table(name), index=False)
            allocator.trim()    # its Arrow copy and parquet buffers, given back (issue 51)
    reuse.stop_point()
    rd.write_json_atomic(files.summary, summary())
    rd.write_json_atomic(files.marker, report_target.marker())
    for f in sorted(own):
        if f.is_file():
            rd.fsync_path(f)
    own_names = {f.name for f in own}
    if out.is_dir():                   # what else the old folder holds (.cache, exports)
        for entry in sorted(out.iterdir()):
            if entry.name not in own_names and not entry.name.startswith(".tmp-"):
                reuse.stop_point()
                os.rename(entry, new / entry.name)
    rd.fsync_path(new)                 # its entries: the tables, summary.json, what moved in
    reuse.stop_point()
    if out.is_dir():
        if not _exchange(new, out):
            old = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.rename(out, old)
            reuse.stop_point()
            os.rename(new, out)
            new = old
        rd.fsync_path(out.parent)      # the rename itself
        reuse.stop_point()
        shutil.rmtree(new, ignore_errors=True)          # now the old report
    else:
        os.rename(new, out)
        rd.fsync_path(out.parent)
    return out


def _exchange(a: pathlib.Path, b: pathlib.Path) -> bool:
    """Swap the folders ``a`` and ``b`` atomically (Linux's ``renameat2``); False where it
    cannot be done (another system, an old kernel, a file system without it)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(str(a)), at_fdcwd, os.fsencode(str(b)),
                     rename_exchange) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def remove_leftovers(out: pathlib.Path) -> None:
    """Remove what killed writes of ``out`` left: its ``.NAME.new-PID-*`` / ``.old-PID-*``
    folders beside it and temporary files in its cache, unless their process still runs, and
    its lock file ``.NAME.lock`` unless a process holds it (``report_lock.ReportLock``). A new
    folder first gives back to ``out`` what the killed write had carried into it from there
    (``report_target.restore``): only report files are ever removed."""
    report_lock.remove_stale_report_lock(out)
    cache = rd.ReportDir(out).cache
    patterns = ((out.parent, f".{out.name}.new-*"), (out.parent, f".{out.name}.old-*"),
                (cache, ".tmp-*"), (cache, f".{rd.REPORT_KEY}.*"),
                (cache, f".{rd.INPUTS_MEMO}.*"))
    for folder, pattern in patterns:
        try:
            found = sorted(folder.glob(pattern))
        except OSError:
            continue
        for f in found:
            m = re.match(r"\d+", f.name[len(pattern.split("*")[0]):])
            if m and int(m.group()) != os.getpid() and _alive(int(m.group())):
                continue
            if f.name in spill.OPEN:        # this process' store in use (table_parts)
                continue
            if f.is_dir() and not f.is_symlink():
                if folder == out.parent:          # a report folder of a killed write
                    report_target.restore(f, out)
                shutil.rmtree(f, ignore_errors=True)
            else:
                try:
                    f.unlink()
                except OSError:
                    pass


def _parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Columns of mixed Python objects (lists, dicts) as JSON text, so parquet can hold them;
    the columns held as shared Python strings (``matching.WRITTEN_AS_TEXT``) as the text
    they are written as. A shallow copy: only the columns that change are new (``df`` is
    left as it is)."""
    out = df.copy(deep=False)
    for col in matching.WRITTEN_AS_TEXT:
        if col in out.columns and len(out) and out[col].dtype == object:
            out[col] = out[col].astype("str")
    for col in out.columns:
        if out[col].dtype == object and out[col].map(
                lambda v: isinstance(v, (list, dict, tuple))).any():
            out[col] = out[col].map(lambda v: json.dumps(v, default=str)
                                    if isinstance(v, (list, dict, tuple)) else v)
    return out
