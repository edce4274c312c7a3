"""Reading a report: summary.json and the tables — the one place that knows older schemas.

``read_summary(doc) -> Summary`` turns a summary.json document of any schema version into the
current ``model.Summary`` — an older one first migrated to today's keys (``migrate``), then
every field typed by the one codec (``codec.decode``, read off the record's own type hints).
Nothing is re-chosen on read: the headline step time of a schema-3 or later report is the one
the analysis chose and wrote. A value of the wrong type is a ``ReportError`` naming the field
(``read_summary_file`` adds the file), and so is a document without an integer
``schema_version`` (not a meshscope summary) or of a newer version than this one reads; a key
this version does not declare is ignored, one an older report lacks reads as null, an empty
list or map.

The migrations (``migrate``), oldest first:

- schema 1 and 2: the step times. Schema 2 wrote the replayed makespan as ``step_time_us``
  (its ``step_time_source`` said so) beside ``throughput.step_time_us`` (the step timer);
  schema 1 only the per-rank windows, whose largest mean stands in for the window. They are
  mapped onto schema 3's ``step_time_timer_us``, ``step_time_replayed_us``, ``window_us`` and
  the headline chosen from them (``model.choose_headline``), once, here.
- schema 2's ``stage_imbalance`` is ``stage_imbalance_without_straggler``.
- older ``cross_rank.rank_waits`` rows give the wait each rank caused.
- schema 3's ``gpu_idle_per_rank_mean[].idle_us`` repeated ``per_rank_mean[].idle_us``; schema
  4 writes it once (an unknown key, ignored on read).

The records (``Summary.cross_rank``, ``per_rank_mean``, ``pipeline_stages``, ``hangs``,
``bandwidth``, ``gpu_idle_per_rank_mean``, ``top_kernels``, ``memory``…) are typed, so that no
page reads the document with chained ``.get``.

And the report's tables, the other half of a report (``analysis/report/tables.py`` registers
each with its columns):

- ``read_table(report_dir, name) -> DataFrame``: ``name.parquet`` with every registered column,
  in the registered order. An older report is read here and only here: a column it lacks is
  added empty (null), a column it named otherwise (``RENAMED``) gets today's name, and a table
  it never wrote is an empty frame with the columns — so a page asks "are there rows, are the
  values known", never "does this column exist". Nullable columns are made plain here
  (``plain_columns``: NaN or None for a missing value, never ``pd.NA``). A file that is not readable parquet is a
  ``ReportError`` naming the file and the problem. ``table_written(report_dir, name)`` says
  whether the report has the file at all (to tell an older report, which a re-analysis would
  complete, from a run that had nothing to put there).
- ``clock_offsets(df) -> [ClockOffset]``, ``kernels(df) -> [Kernel]``, ``gemms(df) ->
  [Gemm]``, ``stream_idle(df) -> [StreamIdle]`` and ``stage_computes(df) -> [StageCompute]``:
  the rows a page iterates, as typed records (None where the table does not know a value).
- ``flight_recorder_verdicts(table, summary)`` (the verdicts table, or schema 1's hangs in
  its columns) and ``heatmap_runs(df)`` (the step heatmap in at most a screen of columns).

The dashboard's pages read a report through this module and ``report/model.py`` only
(``tests/test_one_definition.py`` checks their imports).
"""
from __future__ import annotations

import json
import os
import pathlib

from typing import TYPE_CHECKING, Any

from meshscope.analysis.report import codec
from meshscope.analysis.report.model import (  # noqa: F401 - the records read here
    HEADLINE_ORDER, REPORT_SCHEMA_VERSION, SHORT, BandwidthRow, ClockOffset, CrossRank, Finding,
    Gemm, GpuIdle, Hang, Kernel, MemoryDevice, MemorySnapshot, MemoryStage, MemorySummary,
    RankMean, RankSaving, Stage, StageCompute, StepTime, Straggler, StreamIdle, Summary,
    TopKernel, choose_headline)
from meshscope.collectors.run_dir import ReportDir

# pandas and the table registry (which imports every analyser) are imported by the functions
# that read tables: reading summary.json stays light, so `meshscope analyze` on a report it
# can reuse prints it without importing pandas (analysis/report/reuse.py).
if TYPE_CHECKING:
    import pandas as pd


class ReportError(ValueError):
    """A report file that cannot be read; the message names the file and the problem."""


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x \
        else None


def _legacy_window(doc: dict) -> float | None:
    """Schema 1's window: the largest rank's mean window (all it wrote)."""
    windows = [_num(m.get("window_us")) for m in doc.get("per_rank_mean") or []
               if isinstance(m, dict)]
    windows = [w for w in windows if w is not None]
    return max(windows) if windows else None


def _migrate_step_times(doc: dict) -> dict:
    tp = doc.get("throughput") if isinstance(doc.get("throughput"), dict) else {}
    timer = _num(tp.get("step_time_us"))
    old = _num(doc.get("step_time_us"))
    replayed_src = str(doc.get("step_time_source") or "").startswith("replayed")
    replayed = old if old is not None and replayed_src else None
    window = old if old is not None and not replayed_src else _legacy_window(doc)
    head, source = choose_headline(timer, replayed, window)
    return {**doc, "step_time_us": head, "step_time_source": source,
            "step_time_timer_us": timer, "step_time_replayed_us": replayed,
            "window_us": window}


def _migrate_rank_waits(doc: dict) -> dict:
    cross = doc.get("cross_rank")
    if not isinstance(cross, dict) or not isinstance(cross.get("rank_waits"), list):
        return doc
    waits = {int(r["rank"]): r.get("wait_caused_us") for r in cross["rank_waits"]
             if isinstance(r, dict) and _num(r.get("rank")) is not None}
    savings = [dict(r) for r in cross.get("rank_savings") or [] if isinstance(r, dict)]
    for r in savings:
        if r.get("wait_caused_us") is None and _num(r.get("rank")) is not None:
            r["wait_caused_us"] = waits.get(int(r["rank"]))
    known = {int(r["rank"]) for r in savings if _num(r.get("rank")) is not None}
    savings += [{"rank": rank, "wait_caused_us": w} for rank, w in waits.items()
                if rank not in known]
    return {**doc, "cross_rank": {**cross, "rank_savings":
                                  sorted(savings, key=lambda r: _num(r.get("rank")) or 0)}}


def migrate(doc: dict) -> dict:
    """A summary.json document of any schema version with today's keys (module docstring);
    today's is returned as it is."""
    version = doc.get("schema_version")
    if not isinstance(version, int) or version < 3:
        doc = _migrate_step_times(doc)
        if "stage_imbalance" in doc:
            doc = {**doc, "stage_imbalance_without_straggler": doc["stage_imbalance"]}
    if not isinstance(version, int) or version < 4:
        doc = _migrate_rank_waits(doc)
    return doc


def read_summary(doc: dict) -> Summary:
    """The typed ``Summary`` of a summary.json document of any schema version up to this
    one's; ``ReportError`` for a document without an integer ``schema_version`` (not a
    meshscope summary), of a newer version (its fields may mean what this version cannot
    know), or naming the field whose value is not what the schema says."""
    version = doc.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ReportError("summary.json: no schema_version: not a meshscope summary")
    if version > REPORT_SCHEMA_VERSION:
        raise ReportError(f"summary.json: schema version {version}, newer than this meshscope "
                          f"reads (up to {REPORT_SCHEMA_VERSION}): analyse the run again with "
                          f"this version (meshscope analyze --no-cache), or use a newer one")
    doc = migrate(doc)
    try:
        return codec.decode(Summary, doc)
    except codec.CodecError as e:
        raise ReportError(f"summary.json {e}") from None


def step_time(doc: dict) -> StepTime:
    """The report's step times as summary.json of any schema says them (``read_summary``)."""
    return read_summary(doc).step_time


# ---- the report's tables -----------------------------------------------------------------

#: Columns an older report wrote under another name, per table: old name -> registered name
#: (schema 1's bandwidth table named the group's ranks ``group``).
RENAMED: dict[str, dict[str, str]] = {"bandwidth": {"group": "pg_ranks"}}


def _folder(report) -> ReportDir:
    """A report directory, given as a path or as anything with a ``report_dir`` (the
    dashboard's ``RunReport``)."""
    return ReportDir(pathlib.Path(getattr(report, "report_dir", report)))


def table_written(report, name: str) -> bool:
    """Whether the report directory holds ``name.parquet`` (an older report may not)."""
    return _folder(report).table(name).is_file()


def read_table(report, name: str) -> pd.DataFrame:
    """``name.parquet`` of ``report`` (a report directory) with every column registered for
    ``name`` in ``tables.COLUMNS``, in order, then any other column the file has: a column an
    older report lacks is added empty (null), one it named otherwise (``RENAMED``) is renamed,
    and a table the report never wrote is an empty frame with the registered columns.
    ``ReportError`` (naming the file) when the file is there but is not readable parquet."""
    import pandas as pd

    from meshscope.analysis.report import tables

    if name not in tables.COLUMNS:
        raise ValueError(f"{name}: not a report table (analysis/report/tables.py)")
    path = _folder(report).table(name)
    if not path.is_file():
        return tables.empty(name)
    try:
        df = pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several types (ArrowInvalid, OSError…) for one cause
        raise ReportError(f"{path}: not readable parquet ({type(e).__name__}: {e})") from None
    old = {a: b for a, b in RENAMED.get(name, {}).items()
           if a in df.columns and b not in df.columns}
    return plain_columns(tables.ordered(name, df.rename(columns=old) if old else df))


def plain_columns(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with pandas' nullable columns made plain, the one place a reader meets them: an
    integer column with missing values (``Int64``, how parquet keeps ``msg_bytes``) becomes
    float with NaN (without any, int64), a nullable float float64 with NaN, a nullable boolean
    or string column objects with None — so a page compares and formats a missing value as
    NaN or None, never as ``pd.NA`` ("boolean value of NA is ambiguous"). A shallow copy:
    the other columns are shared."""
    import numpy as np
    import pandas as pd

    out = None
    for col in df.columns:
        dtype = df[col].dtype
        if not isinstance(dtype, pd.api.extensions.ExtensionDtype) or \
                isinstance(dtype, pd.CategoricalDtype):
            continue
        s = df[col]
        if pd.api.types.is_integer_dtype(dtype):
            s = s.astype("int64") if not s.isna().any() else s.astype("float64")
        elif pd.api.types.is_float_dtype(dtype):
            s = s.astype("float64")
        else:
            s = pd.Series(np.where(s.isna().to_numpy(), None, s.astype(object).to_numpy()),
                          index=s.index, dtype=object)
        out = df.copy(deep=False) if out is None else out
        out[col] = s
    return df if out is None else out


def read_summary_file(report) -> dict:
    """``summary.json`` of a report directory as written (a JSON object); ``ReportError``
    naming the file when it is absent, not JSON or not an object."""
    path = _folder(report).summary
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ReportError(f"{path}: {e.strerror or os.strerror(e.errno or 0)}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise ReportError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ReportError(f"{path}: not a JSON object")
    return doc


def _cell_num(x) -> float | None:
    """A table cell as a float; None for null/NaN or a non-number."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if v != v else v


def _cell_str(x) -> str | None:
    return None if x is None or (isinstance(x, float) and x != x) else str(x)


def clock_offsets(df: pd.DataFrame) -> list[ClockOffset]:
    """``clock_offsets.parquet`` (as ``read_table`` gives it) as typed rows, by rank."""
    rows = [ClockOffset(int(r), _cell_num(o), _cell_num(u),
                        None if _cell_num(n) is None else int(_cell_num(n) or 0), _cell_str(s),
                        _cell_num(a) or 0.0)
            for r, o, u, n, s, a in zip(df["rank"], df["offset_us"], df["uncertainty_us"],
                                        df["n"], df["source"], df["applied_us"])
            if _cell_num(r) is not None]
    return sorted(rows, key=lambda c: c.rank)


def kernels(df: pd.DataFrame) -> list[Kernel]:
    """``kernels.parquet`` (as ``read_table`` gives it) as typed rows, in the table's order."""
    import pandas as pd

    return [Kernel(int(r), "" if n is None else str(n), _cell_str(c), int(_cell_num(k) or 0),
                   _cell_num(t) or 0.0, _cell_num(m), _cell_num(p),
                   False if pd.isna(g) else bool(g))
            for r, n, c, k, t, m, p, g in zip(df["rank"], df["name"], df["category"],
                                               df["count"], df["total_us"], df["mean_us"],
                                               df["share_pct"], df["graph"])]


def gemms(df: pd.DataFrame) -> list[Gemm]:
    """``gemms.parquet`` (as ``read_table`` gives it) as typed rows, in the table's order."""
    return [Gemm(int(r), "" if o is None else str(o), _cell_str(s), _cell_str(d) or None,
                 int(_cell_num(c) or 0), _cell_num(f) or 0.0, _cell_num(k) or 0.0,
                 _cell_num(t), _cell_num(p), _cell_num(e))
            for r, o, s, d, c, f, k, t, p, e in zip(
                df["rank"], df["op"], df["shapes"], df["dtype"], df["calls"], df["flops"],
                df["kernel_us"], df["tflops"], df["peak_tflops"], df["efficiency"])]


def stream_idle(df: pd.DataFrame) -> list[StreamIdle]:
    return [StreamIdle(int(r), str(s), _cell_num(i), _cell_num(h), _cell_num(k), _cell_num(o))
            for r, s, i, h, k, o in zip(df["rank"], df["stream"], df["idle_us"],
                                        df["host_wait_us"], df["kernel_wait_us"],
                                        df["other_us"])]


def stage_computes(df: pd.DataFrame) -> list[StageCompute]:
    return [StageCompute(int(s), _cell_num(c), _cell_num(r))
            for s, c, r in zip(df["stage"], df["compute_per_mb_us"], df["ratio_to_mean"])]


def flight_recorder_verdicts(written: pd.DataFrame | None, summary: Summary
                             ) -> pd.DataFrame | None:
    """The Flight Recorder verdicts: ``written``, the report's ``flight_recorder`` table as
    ``read_table`` gives it (None when the report has no such file), else — schema 1 wrote no
    such table — summary.json's ``hangs`` in the table's columns; None when the report has
    neither (a run without dumps)."""
    import dataclasses

    import pandas as pd

    from meshscope.analysis.report import tables

    if written is not None:
        return written
    if not summary.hangs_in_summary:
        return None
    return tables.ordered("flight_recorder", pd.DataFrame(
        [dataclasses.asdict(h) for h in summary.hangs or []],
        columns=[f.name for f in dataclasses.fields(Hang)]))


def heatmap_runs(heatmap: pd.DataFrame) -> pd.DataFrame:
    """``step_heatmap.parquet``'s rows (with their warmup/profiled/slow flags known) in at most
    ``records.steps.MAX_HEATMAP_COLUMNS`` columns of steps, one row per rank and column: the
    shape a long run's heatmap is shown in (``records.steps.heatmap_columns`` documents it)."""
    from meshscope.analysis.records import steps

    return steps.heatmap_columns(heatmap)
