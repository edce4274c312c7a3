"""Every table of a report and its columns: the one registry, in groups.

A report directory holds ``summary.json`` and one parquet file per table
(docs/report-format.md describes each column). The tables are the fields of six records, one
per part of the report — ``StepTimeTables`` (where each rank's step went), ``RecordTables``
(the always-on records), ``PipelineTables``, ``CommTables``, ``GraphTables`` (the step
dependency graph's what-if), ``GpuTables`` (only device traces fill them) and ``MemoryTables``
(traces recorded with ``profile_memory``, memory snapshots: ``analysis/memory/gather.py``) —
and each field carries its columns: the producing module's own constant, named here once, so
that a table is written with its columns even when it is empty (a run with step timers but no
traces writes every table, each empty with its columns) and a test can hold every written
table to its contract (``tests/test_report_tables.py``).

``COLUMNS`` (name → columns), ``NAMES``, ``GPU`` and ``MEMORY`` are read off the records;
``ordered(name, df)`` is ``df`` with the registered columns first, in order, and a column the
table lacks added empty — what ``Report.write`` stores for an empty table.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator, TypeVar, cast

import pandas as pd

from meshscope.analysis.comm import bandwidth_report, matching
from meshscope.analysis.comm import instances as comm_instances
from meshscope.analysis.crossrank import clocks, graph
from meshscope.analysis.crossrank import whatif as crossrank_whatif
from meshscope.analysis.gpu import host_activity
from meshscope.analysis.gpu import kernels as gpu_kernels
from meshscope.analysis.gpu import step_categories as gpu_step_categories
from meshscope.analysis.gpu import idle as gpu_idle
from meshscope.analysis.memory.gather import TABLES as MEMORY_COLUMNS
from meshscope.analysis.pipeline import bubble, schedule
from meshscope.analysis.records import flight_recorder as fr_records
from meshscope.analysis.records import hang_causes
from meshscope.analysis.records import steps
from meshscope.analysis.report import table_parts
from meshscope.analysis.timeline import breakdown as step_breakdown
from meshscope.analysis.timeline import operators, segments


def _table(columns: list[str]) -> Any:
    """A table field: its registered columns in the field's metadata, no default."""
    return dataclasses.field(metadata={"columns": columns})


class _Tables:
    """What every group of tables can do: name its tables, be made empty.

    A table may be held on disk in parts (``table_parts.TableParts``, put in with
    ``on_disk``: the analysis does so for its tables with rows per rank — the instance and
    bandwidth tables, a row per collective instance and rank, the largest —, issue 51):
    reading the field gives the whole table back as a DataFrame, ``stored`` the parts
    themselves (what the report's write streams)."""

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if isinstance(value, table_parts.TableParts):
            return value.frame()
        return value

    def items(self) -> Iterator[tuple[str, pd.DataFrame]]:
        """(table name, table) of every table of the group, in field order."""
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            yield f.name, getattr(self, f.name)

    def stored(self) -> Iterator[tuple[str, pd.DataFrame | table_parts.TableParts]]:
        """(table name, table) of every table of the group as it is held: a table kept on
        disk as its ``TableParts``, not read back."""
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            yield f.name, object.__getattribute__(self, f.name)

    @classmethod
    def empty(cls: type[_G], **given: pd.DataFrame) -> _G:
        """The group with every table empty with its registered columns, but ``given``."""
        return cls(**{f.name: given[f.name] if f.name in given else
                      pd.DataFrame(columns=f.metadata["columns"])
                      for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


_G = TypeVar("_G", bound=_Tables)


@dataclasses.dataclass(frozen=True)
class StepTimeTables(_Tables):
    """Where each rank's profiled steps went (``timeline/``)."""
    breakdown: pd.DataFrame = _table(step_breakdown.COLUMNS)
    exposed_comm: pd.DataFrame = _table(step_breakdown.EXPOSED_COLUMNS)  # per (rank, step, dim, op)
    operator_totals: pd.DataFrame = _table(operators.COLUMNS)     # per (rank, step, name)
    trace_overlap: pd.DataFrame = _table(step_breakdown.TRACE_OVERLAP_COLUMNS)
    timeline: pd.DataFrame = _table(segments.COLUMNS)
    idle: pd.DataFrame = _table(step_breakdown.IDLE_COLUMNS)           # where device idle went


@dataclasses.dataclass(frozen=True)
class RecordTables(_Tables):
    """What the always-on records say (``records/``): step timers and Flight Recorder."""
    step_heatmap: pd.DataFrame = _table(steps.HEATMAP_COLUMNS)
    throughput: pd.DataFrame = _table(steps.THROUGHPUT_COLUMNS)
    flight_recorder: pd.DataFrame = _table(fr_records.COLUMNS)
    hang_causes: pd.DataFrame = _table(hang_causes.COLUMNS)     # why ranks stopped


@dataclasses.dataclass(frozen=True)
class PipelineTables(_Tables):
    """Bubbles, microbatches, phases and stage imbalance (``pipeline/``)."""
    bubbles: pd.DataFrame = _table(
        bubble.COLUMNS + ["replayed_window_us", "replayed_bubble_fraction"])
    microbatches: pd.DataFrame = _table(schedule.MB_COLUMNS)
    pipeline_phases: pd.DataFrame = _table(schedule.PHASE_COLUMNS)
    stage_imbalance: pd.DataFrame = _table(schedule.IMBALANCE_COLUMNS)


@dataclasses.dataclass(frozen=True)
class CommTables(_Tables):
    """The collective instances, matched and aligned, and their bandwidth (``comm/``)."""
    instances: pd.DataFrame = _table(comm_instances.INSTANCE_COLUMNS + ["match_id"])
    collectives: pd.DataFrame = _table(matching.COLLECTIVE_COLUMNS)
    clock_offsets: pd.DataFrame = _table(clocks.COLUMNS)
    bandwidth: pd.DataFrame = _table(
        bandwidth_report.TABLE_COLUMNS + ["bus_factor", "algbw_gbps", "busbw_gbps"])
    bandwidth_summary: pd.DataFrame = _table(bandwidth_report.SUMMARY_COLUMNS)


@dataclasses.dataclass(frozen=True)
class GraphTables(_Tables):
    """Each step's dependency graph: what-if savings, critical path, waits (``crossrank/``)."""
    whatif: pd.DataFrame = _table(crossrank_whatif.WHATIF_COLUMNS)
    critical_path: pd.DataFrame = _table(graph.PATH_COLUMNS)
    rank_waits: pd.DataFrame = _table(crossrank_whatif.SAVINGS_COLUMNS)


@dataclasses.dataclass(frozen=True)
class GpuTables(_Tables):
    """What only device traces fill (``gpu/``)."""
    step_categories: pd.DataFrame = _table(gpu_step_categories.COLUMNS)
    stream_idle: pd.DataFrame = _table(gpu_idle.STREAM_COLUMNS)
    sync_calls: pd.DataFrame = _table(
        ["rank", "step"] + host_activity.SITE_COLUMNS + ["idle_after_us"])
    kernels: pd.DataFrame = _table(gpu_kernels.KERNEL_COLUMNS)          # the top kernels per rank
    kernel_totals: pd.DataFrame = _table(gpu_kernels.TOTALS_COLUMNS)    # per (rank, step, name)
    kernel_categories: pd.DataFrame = _table(["rank", "category", "count", "total_us"])
    gemms: pd.DataFrame = _table(gpu_kernels.GEMM_COLUMNS)


@dataclasses.dataclass(frozen=True)
class MemoryTables(_Tables):
    """Memory (``analysis/memory``): per rank, device and step; peaks and growth; live at the
    peak; the curve; model states measured; the memory snapshots' segments and live blocks."""
    memory_steps: pd.DataFrame = _table(MEMORY_COLUMNS["memory_steps"])
    memory_devices: pd.DataFrame = _table(MEMORY_COLUMNS["memory_devices"])
    memory_live: pd.DataFrame = _table(MEMORY_COLUMNS["memory_live"])
    memory_curve: pd.DataFrame = _table(MEMORY_COLUMNS["memory_curve"])
    memory_terms: pd.DataFrame = _table(MEMORY_COLUMNS["memory_terms"])
    memory_segments: pd.DataFrame = _table(MEMORY_COLUMNS["memory_segments"])
    memory_snapshot_live: pd.DataFrame = _table(MEMORY_COLUMNS["memory_snapshot_live"])


GROUPS: tuple[type[_Tables], ...] = (StepTimeTables, RecordTables, PipelineTables, CommTables,
                                     GraphTables, GpuTables, MemoryTables)


def _columns(group: type[_Tables]) -> dict[str, list[str]]:
    return {f.name: f.metadata["columns"] for f in dataclasses.fields(group)}  # type: ignore[arg-type]


GPU_COLUMNS: dict[str, list[str]] = _columns(GpuTables)
COLUMNS: dict[str, list[str]] = {name: cols for group in GROUPS
                                 for name, cols in _columns(group).items()}
NAMES: tuple[str, ...] = tuple(COLUMNS)
GPU: tuple[str, ...] = tuple(GPU_COLUMNS)
MEMORY: tuple[str, ...] = tuple(_columns(MemoryTables))


def on_disk(table: table_parts.TableParts) -> pd.DataFrame:
    """``table`` as the value of a group's field: the field reads as the whole table
    (``_Tables``), the report's write streams its parts (``_Tables.stored``)."""
    return cast(pd.DataFrame, table)


def empty(name: str) -> pd.DataFrame:
    """The table ``name`` with no rows and its registered columns."""
    return pd.DataFrame(columns=COLUMNS[name])


def ordered(name: str, df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``name``'s registered columns (added empty where missing) first, in order,
    then any other columns it has."""
    cols = COLUMNS[name]
    if list(df.columns[:len(cols)]) == cols:
        return df
    rest = [c for c in df.columns if c not in cols]
    return df.reindex(columns=cols + rest)
