"""``Report``: everything one analysis found, before it is written.

Its tables come in the registry's groups (``report/tables.py``: where each rank's step went,
the always-on records, the pipeline, communication, the dependency graph, the GPU, memory);
the rest — which ranks, the problems and notes, the cross-rank verdicts, the step times, the
findings — is its ``Summary`` (``report/model.py``, built by ``report/summary.py``).
``write`` stores it crash-safe (``report/crash_safe.py``); docs/report-format.md lists what is
written, docs/metrics.md defines every number.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Iterator

import pandas as pd

from meshscope.analysis.records import steps as step_records
from meshscope.analysis.report import crash_safe
from meshscope.analysis.report.model import Finding, Summary
from meshscope.analysis.report.summary import Facts, Groups, build, document
from meshscope.collectors.run_info import RunInfo


@dataclasses.dataclass(frozen=True)
class Report(Groups):
    """What one analysis found: its tables by group (``summary.Groups``: steps, records,
    pipeline, comm, graph, gpu, memory), the run, and its ``Summary`` (the typed
    summary.json, findings included; ``summary.build``)."""
    source: pathlib.Path
    run: RunInfo | None
    on_gpu: bool
    step_records: step_records.StepRecords      # the step timers' analysis (records/steps)
    summary: Summary

    @classmethod
    def of(cls, facts: Facts, groups: Groups, on_gpu: bool) -> Report:
        """The report of ``facts`` and ``groups``, its summary built (``summary.build``)."""
        return cls(source=facts.source, run=facts.run, on_gpu=on_gpu,
                   **{f.name: getattr(groups, f.name) for f in dataclasses.fields(groups)},
                   step_records=facts.step_records, summary=build(facts, groups))

    # What the summary says, read where a notebook or a test looks for it on the report.
    @property
    def findings(self) -> list[Finding]:
        return self.summary.findings

    @property
    def ranks(self) -> list[int]:
        return self.summary.ranks

    @property
    def missing_ranks(self) -> list[int]:
        return self.summary.missing_ranks

    @property
    def problems(self) -> list[str]:
        return self.summary.problems

    @property
    def notes(self) -> list[str]:
        return self.summary.notes

    @property
    def device(self) -> str | None:
        return self.summary.device

    def tables(self) -> Iterator[tuple[str, pd.DataFrame]]:
        """(name, table) of every table of the report, group by group."""
        for group in (self.steps, self.records, self.pipeline, self.comm, self.graph,
                      self.gpu, self.memory):
            yield from group.items()

    def write(self, out: pathlib.Path) -> pathlib.Path:
        """Write the report to ``out`` — every table of the registry as parquet and
        ``summary.json`` (``summary.document``) —, crash-safe and durable
        (``crash_safe.write_folder``); a table held on disk in parts written from them by
        streaming (``table_parts.write_parquet``)."""
        stored = (item for group in (self.steps, self.records, self.pipeline, self.comm,
                                     self.graph, self.gpu, self.memory)
                  for item in group.stored())
        return crash_safe.write_folder(out, self.source, stored,
                                       lambda: document(self.summary))
