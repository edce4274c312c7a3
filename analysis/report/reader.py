"""Reading a report's summary.json: the one place that knows its older schema versions.

The dashboard, ``meshscope compare`` and the text report read the quantities below through
these functions, so each is found under one name and shown with one label whatever the
report's age:

- ``step_time(summary) -> StepTime``: the headline step time, its source (``timer``,
  ``replayed``, ``window``) and label, and the three step times under their own names.
  Schema 3 writes them (``analysis/report/summary.py``); schema 2 wrote the replayed makespan
  as ``step_time_us`` beside ``throughput.step_time_us`` (the step timer), and schema 1 only the
  per-rank windows: both are mapped here onto schema 3's names, the timer first.
- ``read_summary(doc) -> Summary``: the fields a reader shows, typed (findings as ``Finding``),
  tokens/s and MFU only beside the step timer's step time they were computed from.
- ``stage_imbalance(summary) -> (measured, without_straggler)``: the pipeline stages'
  max/mean, measured (compute per microbatch, ``stage_imbalance.parquet``) and replayed with
  the straggler at its peers' pace (``crossrank/whatif.py``; schema 2's ``stage_imbalance``).
- ``Summary.cross_rank`` (``CrossRank``: the straggler, each rank's what-if saving and the
  wait it caused, the what-if's resolution), ``Summary.per_rank_mean`` (one ``RankMean`` per
  rank: the step breakdown, exposed communication per dimension),
  ``Summary.pipeline_stages`` (``Stage``), ``Summary.hangs`` (``Hang``), ``Summary.bandwidth``
  (``BandwidthRow``), ``Summary.gpu_idle_per_rank_mean`` (``GpuIdle``) and
  ``Summary.top_kernels`` (``TopKernel``) and ``Summary.memory`` (``MemorySummary``: per rank
  and device ``MemoryDevice``, per stage ``MemoryStage``, per snapshot ``MemorySnapshot``):
  typed rows, so that no page reads the document with chained ``.get``.

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

from typing import TYPE_CHECKING

from meshscope.analysis.report.model import (  # noqa: F401 - the records read here
    HEADLINE_ORDER, SHORT, BandwidthRow, ClockOffset, CrossRank, Finding, Gemm, GpuIdle, Hang, Kernel,
    MemoryDevice, MemorySnapshot, MemoryStage, MemorySummary, RankMean, RankSaving, Stage,
    StageCompute, StepTime, Straggler, StreamIdle, Summary, TopKernel, choose_headline)
from meshscope.collectors.run_dir import ReportDir
from meshscope.vocabulary import IDLE_CAUSES

# pandas and the table registry (which imports every analyser) are imported by the functions
# that read tables: reading summary.json stays light, so `meshscope analyze` on a report it
# can reuse prints it without importing pandas (analysis/report/reuse.py).
if TYPE_CHECKING:
    import pandas as pd



def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x \
        else None


def _window(summary: dict) -> float | None:
    windows = [_num(m.get("window_us")) for m in summary.get("per_rank_mean") or []
               if isinstance(m, dict)]
    windows = [w for w in windows if w is not None]
    return max(windows) if windows else None


def step_time(summary: dict) -> StepTime:
    """The report's step times under schema 3's names (older schemas mapped)."""
    version = summary.get("schema_version")
    tp = summary.get("throughput") if isinstance(summary.get("throughput"), dict) else {}
    if isinstance(version, int) and version >= 3:
        timer, replayed = _num(summary.get("step_time_timer_us")), \
            _num(summary.get("step_time_replayed_us"))
        window = _num(summary.get("window_us"))
    else:
        timer = _num(tp.get("step_time_us"))
        old = _num(summary.get("step_time_us"))
        src = str(summary.get("step_time_source") or "")
        replayed = old if old is not None and src.startswith("replayed") else None
        window = old if old is not None and not src.startswith("replayed") else _window(summary)
    head, source = choose_headline(timer, replayed, window)
    return StepTime(head, source, timer, replayed, window)


def stage_imbalance(summary: dict) -> tuple[dict | None, dict | None]:
    """(measured, without the straggler) stage imbalance dicts, each with ``max_over_mean``
    and ``slowest_stage``; None where the report has none."""
    def d(x):
        return x if isinstance(x, dict) and _num(x.get("max_over_mean")) is not None else None
    if isinstance(summary.get("schema_version"), int) and summary["schema_version"] >= 3:
        return d(summary.get("stage_imbalance_measured")), \
            d(summary.get("stage_imbalance_without_straggler"))
    return None, d(summary.get("stage_imbalance"))


def _dict(x) -> dict:
    return x if isinstance(x, dict) else {}


def _dicts(x) -> list[dict]:
    return [r for r in x if isinstance(r, dict)] if isinstance(x, list) else []


def _strs(x) -> list[str]:
    return [str(v) for v in x] if isinstance(x, list) else []


def _rank_mean(d: dict) -> RankMean:
    by_dim = {k[len("exposed_comm_"):-3]: v for k, v in
              ((k, _num(v)) for k, v in d.items() if isinstance(k, str))
              if k.startswith("exposed_comm_") and k.endswith("_us")
              and k != "exposed_comm_us" and v is not None}
    return RankMean(rank=int(d["rank"]), window_us=_num(d.get("window_us")),
                    compute_us=_num(d.get("compute_us")), comm_us=_num(d.get("comm_us")),
                    overlapped_comm_us=_num(d.get("overlapped_comm_us")),
                    exposed_comm_us=_num(d.get("exposed_comm_us")), exposed_by_dim_us=by_dim,
                    bubble_us=_num(d.get("bubble_us")), other_us=_num(d.get("other_us")),
                    idle_us=_num(d.get("idle_us")), overlap_pct=_num(d.get("overlap_pct")))


def _opt_str(x) -> str | None:
    return str(x) if x not in (None, "") else None


def _cross_rank(doc: dict) -> CrossRank:
    cross = _dict(doc.get("cross_rank"))
    st = _dict(cross.get("straggler"))
    straggler = None
    if isinstance(st.get("rank"), (int, float)) and not isinstance(st.get("rank"), bool):
        straggler = Straggler(
            rank=int(st["rank"]), saving_us=_num(st.get("saving_us")),
            saving_pct=_num(st.get("saving_pct")), reference=_opt_str(st.get("reference")),
            gate_us=_num(st.get("gate_us")), wait_caused_us=_num(st.get("wait_caused_us")),
            last_share=_num(st.get("last_share")),
            evidence={k: v for k, v in st.items() if not isinstance(v, (dict, list))})
    waits = {int(r["rank"]): _num(r.get("wait_caused_us"))
             for r in _dicts(cross.get("rank_waits")) if _num(r.get("rank")) is not None}
    savings = []
    for r in _dicts(cross.get("rank_savings")):
        if _num(r.get("rank")) is None:
            continue
        rank = int(r["rank"])
        wait = _num(r.get("wait_caused_us"))
        savings.append(RankSaving(rank, _num(r.get("saving_us")), _num(r.get("saving_pct")),
                                  _opt_str(r.get("reference")),
                                  wait if wait is not None else waits.pop(rank, None)))
    savings += [RankSaving(rank, None, None, None, w) for rank, w in waits.items()
                if rank not in {s.rank for s in savings}]
    return CrossRank(straggler=straggler, rank_savings=sorted(savings, key=lambda r: r.rank),
                     why_not=_strs(cross.get("why_not")), noise_us=_num(cross.get("noise_us")),
                     floor_us=_num(cross.get("floor_us")),
                     resolution_us=_num(cross.get("resolution_us")))


def _hang(d: dict) -> Hang:
    seq = _num(d.get("seq"))
    return Hang(process_group=_opt_str(d.get("process_group")),
                group_desc=_opt_str(d.get("group_desc")), seq=None if seq is None else int(seq),
                kind=_opt_str(d.get("kind")), op=_opt_str(d.get("op")),
                verdict=_opt_str(d.get("verdict")), ranks_present=_ints(d.get("ranks_present")),
                ranks_missing=_ints(d.get("ranks_missing")),
                last_seq_of_missing=_opt_str(d.get("last_seq_of_missing")),
                detail=str(d.get("detail") or ""))


def _int_or_none(x) -> int | None:
    v = _num(x)
    return None if v is None else int(v)


def _bandwidth(d: dict) -> BandwidthRow:
    return BandwidthRow(dim=str(d.get("dim") or ""), op=str(d.get("op") or ""),
                        group_size=_int_or_none(d.get("group_size")),
                        size_bucket=_int_or_none(d.get("size_bucket")),
                        instances=_int_or_none(d.get("instances")),
                        msg_bytes=_num(d.get("msg_bytes")), transfer_us=_num(d.get("transfer_us")),
                        busbw_gbps=_num(d.get("busbw_gbps")),
                        busbw_max_gbps=_num(d.get("busbw_max_gbps")),
                        baseline_busbw_gbps=_num(d.get("baseline_busbw_gbps")),
                        efficiency=_num(d.get("efficiency")))


def _gpu_idle(d: dict) -> GpuIdle:
    """A row of ``gpu_idle_per_rank_mean``: the causes the report wrote, in the vocabulary's
    order, then any a newer report adds (an older report's row lacks the later causes)."""
    known = [c for c in IDLE_CAUSES if f"idle_{c}_us" in d]
    newer = [k[5:-3] for k in d if k.startswith("idle_") and k.endswith("_us")
             and k != "idle_us" and k[5:-3] not in IDLE_CAUSES]
    return GpuIdle(rank=int(d["rank"]), idle_us=_num(d.get("idle_us")),
                   by_cause_us={c: _num(d[f"idle_{c}_us"]) for c in known + newer})


def _top_kernel(d: dict) -> TopKernel:
    return TopKernel(rank=int(d["rank"]), name=str(d.get("name") or ""),
                     category=str(d.get("category") or ""),
                     count=_int_or_none(d.get("count")) or 0,
                     total_us=_num(d.get("total_us")) or 0.0, share_pct=_num(d.get("share_pct")))


def _memory_device(d: dict) -> MemoryDevice:
    return MemoryDevice(
        rank=int(d["rank"]), device=str(d.get("device") or "?"), totals=_opt_str(d.get("totals")),
        stage=_int_or_none(d.get("stage")),
        peak_allocated_bytes=_num(d.get("peak_allocated_bytes")),
        peak_step=_int_or_none(d.get("peak_step")), peak_op=_opt_str(d.get("peak_op")),
        peak_module=_opt_str(d.get("peak_module")),
        peak_reserved_bytes=_num(d.get("peak_reserved_bytes")),
        fragmentation_bytes=_num(d.get("fragmentation_bytes")),
        growth_per_step_bytes=_num(d.get("growth_per_step_bytes")),
        growth_monotone=d.get("growth_monotone") is True,
        device_total_bytes=_num(d.get("device_total_bytes")),
        device_total_source=_opt_str(d.get("device_total_source")))


def _memory(doc: dict) -> MemorySummary:
    m = _dict(doc.get("memory"))
    stages = [MemoryStage(int(s["stage"]), _ints(s.get("ranks")),
                          _num(s.get("peak_allocated_bytes")), _int_or_none(s.get("peak_rank")),
                          _opt_str(s.get("device")))
              for s in _dicts(m.get("stages")) if _num(s.get("stage")) is not None]
    snaps = [MemorySnapshot(int(s["rank"]), str(s.get("device") or "?"),
                            str(s.get("source") or ""), _num(s.get("reserved_bytes")),
                            _num(s.get("allocated_bytes")), _num(s.get("free_in_segments_bytes")),
                            _num(s.get("largest_allocated_bytes")),
                            _int_or_none(s.get("trace_entries")),
                            s.get("oom") if isinstance(s.get("oom"), dict) else None)
             for s in _dicts(m.get("snapshots")) if _num(s.get("rank")) is not None]
    return MemorySummary(devices=[_memory_device(d) for d in _dicts(m.get("devices"))
                                  if _num(d.get("rank")) is not None],
                         stages=stages, snapshots=snaps,
                         device_memory_bytes=_num(m.get("device_memory_bytes")))


def _ints(xs) -> list[int]:
    return [int(x) for x in xs or [] if isinstance(x, (int, float)) and not isinstance(x, bool)]


def _stage(d: dict) -> Stage:
    return Stage(stage=int(d["stage"]), ranks=_ints(d.get("ranks")),
                 bubble_fraction=_num(d.get("bubble_fraction")),
                 replayed_bubble_fraction=_num(d.get("replayed_bubble_fraction")),
                 theory_fraction=_num(d.get("theory_fraction")))


def read_summary(doc: dict) -> Summary:
    """The typed ``Summary`` of a summary.json document (schema 1, 2 or 3)."""
    st = step_time(doc)
    tp = _dict(doc.get("throughput"))
    timer = st.source == "timer"
    measured, corrected = stage_imbalance(doc)
    found = [f for f in map(Finding.read, doc.get("findings") or []) if f is not None]
    version = doc.get("schema_version")
    return Summary(
        schema_version=version if isinstance(version, int) else 0,
        generated=str(doc["generated"]) if doc.get("generated") else None,
        source=_opt_str(doc.get("source")), device=_opt_str(doc.get("device")),
        run=_dict(doc.get("run")),
        ranks=_ints(doc.get("ranks")), steps=_ints(doc.get("steps")),
        warmup_steps=_ints(doc.get("warmup_steps")),
        missing_ranks=_ints(doc.get("missing_ranks")), problems=_strs(doc.get("problems")),
        notes=_strs(doc.get("notes")), step_time=st,
        tokens_per_s=_num(tp.get("tokens_per_s")) if timer else None,
        mfu_pct=_num(tp.get("mfu_pct")) if timer else None,
        per_rank_mean=[_rank_mean(r) for r in _dicts(doc.get("per_rank_mean"))
                       if _num(r.get("rank")) is not None],
        pipeline_stages=[_stage(s) for s in _dicts(doc.get("pipeline_stages"))
                         if _num(s.get("stage")) is not None],
        stage_imbalance_measured=measured, stage_imbalance_without_straggler=corrected,
        cross_rank=_cross_rank(doc), hangs=[_hang(h) for h in _dicts(doc.get("hangs"))],
        hangs_in_summary=isinstance(doc.get("hangs"), list)
        and (not isinstance(version, int) or version < 2 or bool(doc["hangs"])),
        bandwidth=[_bandwidth(b) for b in _dicts(doc.get("bandwidth"))],
        gpu_idle_per_rank_mean=[_gpu_idle(r) for r in _dicts(doc.get("gpu_idle_per_rank_mean"))
                                if _num(r.get("rank")) is not None],
        top_kernels=[_top_kernel(k) for k in _dicts(doc.get("top_kernels"))
                     if _num(k.get("rank")) is not None], findings=found, raw=doc,
        memory=_memory(doc))


# ---- the report's tables -----------------------------------------------------------------

class ReportError(ValueError):
    """A report file that cannot be read; the message names the file and the problem."""


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
    rows = [ClockOffset(int(r), _cell_num(o), _cell_num(u), _cell_num(a) or 0.0, _cell_str(s))
            for r, o, u, a, s in zip(df["rank"], df["offset_us"], df["uncertainty_us"],
                                     df["applied_us"], df["source"]) if _cell_num(r) is not None]
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
        [dataclasses.asdict(h) for h in summary.hangs],
        columns=[f.name for f in dataclasses.fields(Hang)]))


def heatmap_runs(heatmap: pd.DataFrame) -> pd.DataFrame:
    """``step_heatmap.parquet``'s rows (with their warmup/profiled/slow flags known) in at most
    ``records.steps.MAX_HEATMAP_COLUMNS`` columns of steps, one row per rank and column: the
    shape a long run's heatmap is shown in (``records.steps.heatmap_columns`` documents it)."""
    from meshscope.analysis.records import steps

    return steps.heatmap_columns(heatmap)
