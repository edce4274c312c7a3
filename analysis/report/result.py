"""``Report``: everything one analysis found, before it is written.

Its tables come in the registry's groups (``report/tables.py``: where each rank's step went,
the always-on records, the pipeline, communication, the dependency graph, the GPU, memory);
the rest — which ranks, the problems and notes, the cross-rank verdicts, the step timers'
analysis, the findings — goes into summary.json (``report/summary.py``). ``write`` stores it
crash-safe (``report/crash_safe.py``); docs/report-format.md lists what is written,
docs/metrics.md defines every number.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Iterator

import pandas as pd

from meshscope.analysis.records import steps as step_records
from meshscope.analysis.report import crash_safe
from meshscope.analysis.report.findings import Finding
from meshscope.analysis.report.summary import summary_of
from meshscope.analysis.report.tables import (CommTables, GpuTables, GraphTables, MemoryTables,
                                              PipelineTables, RecordTables, StepTimeTables)
from meshscope.collectors.run_info import RunInfo


@dataclasses.dataclass
class Report:
    """What one analysis found: the run and its ranks, the tables by group, the verdicts."""
    source: pathlib.Path
    run: RunInfo | None
    ranks: list[int]
    missing_ranks: list[int]
    problems: list[str]
    notes: list[str]
    on_gpu: bool
    steps: StepTimeTables
    records: RecordTables
    pipeline: PipelineTables
    comm: CommTables
    graph: GraphTables
    gpu: GpuTables
    memory: MemoryTables
    straggler: dict | None
    imbalance: dict | None
    cross_rank: dict
    step_records: step_records.StepRecords      # the step timers' analysis (records/steps)
    step_time_us: float | None                  # the replayed makespan, else the window
    throughput_summary: dict                    # records.steps.throughput_summary, once
    findings: list[Finding]
    # summary.json's ``memory`` beside the memory tables (the snapshots' summaries, the
    # stages' peaks, the device memory given): ``summary.memory_summary``.
    memory_facts: dict = dataclasses.field(default_factory=dict)
    # "gpu" when a rank's trace holds device activity or names a GPU in its deviceProperties
    # (a CUPTI range-profiler trace has counters, no kernels), else "cpu".
    device: str = "cpu"

    def tables(self) -> Iterator[tuple[str, pd.DataFrame]]:
        """(name, table) of every table of the report, group by group."""
        for group in (self.steps, self.records, self.pipeline, self.comm, self.graph,
                      self.gpu, self.memory):
            yield from group.items()

    def summary(self) -> dict:
        return summary_of(self)

    def write(self, out: pathlib.Path) -> pathlib.Path:
        """Write the report to ``out`` — every table of the registry as parquet and
        ``summary.json`` —, crash-safe and durable (``crash_safe.write_folder``)."""
        return crash_safe.write_folder(out, self.source, self.tables(), self.summary)
