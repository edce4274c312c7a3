"""Every table of a report and its columns: the one registry.

A report directory holds ``summary.json`` and one parquet file per entry of ``COLUMNS``
(docs/report-format.md describes each column). The columns are the producing module's own
constant, named here once, so that a table is written with its columns even when it is empty
(a run with step timers but no traces writes every table, each empty with its columns) and a
test can hold every written table to its contract (``tests/test_report_tables.py``).

``GPU`` names the tables that only device traces fill, ``MEMORY`` those of memory
(``analysis/memory/gather.py``: traces recorded with ``profile_memory``, memory snapshots); ``ordered(name, df)`` is ``df`` with the
registered columns first, in order, and a column the table lacks added empty — what
``Report.write`` stores for an empty table.
"""
from __future__ import annotations

import pandas as pd

from meshscope.analysis.comm import bandwidth_report, instances, matching
from meshscope.analysis.crossrank import clocks, graph, whatif
from meshscope.analysis.gpu import host_activity, kernels, step_categories
from meshscope.analysis.gpu import idle as gpu_idle
from meshscope.analysis.memory.gather import TABLES as MEMORY_COLUMNS
from meshscope.analysis.pipeline import bubble, schedule
from meshscope.analysis.records import flight_recorder, steps
from meshscope.analysis.timeline import breakdown, operators, segments

GPU_COLUMNS: dict[str, list[str]] = {
    "step_categories": step_categories.COLUMNS,
    "stream_idle": gpu_idle.STREAM_COLUMNS,
    "sync_calls": ["rank", "step"] + host_activity.SITE_COLUMNS + ["idle_after_us"],
    "kernels": kernels.KERNEL_COLUMNS,
    "kernel_totals": kernels.TOTALS_COLUMNS,
    "kernel_categories": ["rank", "category", "count", "total_us"],
    "gemms": kernels.GEMM_COLUMNS,
}

COLUMNS: dict[str, list[str]] = {
    "breakdown": breakdown.COLUMNS,
    "exposed_comm": breakdown.EXPOSED_COLUMNS,
    "operator_totals": operators.COLUMNS,
    "trace_overlap": breakdown.TRACE_OVERLAP_COLUMNS,
    "bubbles": bubble.COLUMNS + ["replayed_window_us", "replayed_bubble_fraction"],
    "microbatches": schedule.MB_COLUMNS,
    "pipeline_phases": schedule.PHASE_COLUMNS,
    "stage_imbalance": schedule.IMBALANCE_COLUMNS,
    "instances": instances.INSTANCE_COLUMNS + ["match_id"],
    "collectives": matching.COLLECTIVE_COLUMNS,
    "clock_offsets": clocks.COLUMNS,
    "whatif": whatif.WHATIF_COLUMNS,
    "critical_path": graph.PATH_COLUMNS,
    "rank_waits": whatif.SAVINGS_COLUMNS,
    "bandwidth": bandwidth_report.TABLE_COLUMNS + ["bus_factor", "algbw_gbps", "busbw_gbps"],
    "bandwidth_summary": bandwidth_report.SUMMARY_COLUMNS,
    "step_heatmap": steps.HEATMAP_COLUMNS,
    "flight_recorder": flight_recorder.COLUMNS,
    "timeline": segments.COLUMNS,
    "throughput": steps.THROUGHPUT_COLUMNS,
    "idle": breakdown.IDLE_COLUMNS,
    **GPU_COLUMNS,
    **MEMORY_COLUMNS,
}

NAMES: tuple[str, ...] = tuple(COLUMNS)
GPU: tuple[str, ...] = tuple(GPU_COLUMNS)
MEMORY: tuple[str, ...] = tuple(MEMORY_COLUMNS)


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
