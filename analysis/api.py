"""The notebook API: one object per analysed run, whose methods return the report's tables.

    from meshscope import analysis
    run = analysis.open("runs/a")              # or any folder of Kineto traces
    run.breakdown()                            # per rank × step, docs/metrics.md
    run.findings()[0]

Every method returns what ``meshscope analyze`` writes to ``report/`` and what the dashboard
draws — the same objects, computed once by ``analysis.report.analyze``. The columns of each
table are documented in the module that computes it (named in each method) and in
docs/metrics.md.
"""
from __future__ import annotations

import pathlib

import pandas as pd

from meshscope.analysis.report.analyze import analyze
from meshscope.analysis.report.model import Finding, MemorySnapshot, Straggler, Summary
from meshscope.analysis.report.result import Report


class RunAnalysis:
    def __init__(self, report: Report):
        self.report = report

    def __repr__(self) -> str:
        return (f"RunAnalysis({str(self.report.source)!r}, ranks={self.report.ranks}, "
                f"findings={len(self.report.findings)})")

    def summary(self) -> Summary:
        """What summary.json holds, typed (``analysis/report/model.py``; ``codec.encode``
        gives the document)."""
        return self.report.summary

    def breakdown(self) -> pd.DataFrame:
        """Per rank and step: compute/comm/overlap/bubble/idle (analysis/timeline/breakdown.py)."""
        return self.report.steps.breakdown

    def trace_overlap(self) -> pd.DataFrame:
        """Per rank, whole-trace overlap as HTA computes it (analysis/timeline/breakdown.py)."""
        return self.report.steps.trace_overlap

    def bubbles(self) -> pd.DataFrame:
        """Per pipeline stage and step: bubble, theory, replay (analysis/pipeline/bubble.py)."""
        return self.report.pipeline.bubbles

    def microbatches(self) -> pd.DataFrame:
        """Microbatch timeline (analysis/pipeline/schedule.py)."""
        return self.report.pipeline.microbatches

    def pipeline_phases(self) -> pd.DataFrame:
        """Warm-up / steady / cool-down per rank and step (analysis/pipeline/schedule.py)."""
        return self.report.pipeline.pipeline_phases

    def stage_imbalance(self) -> pd.DataFrame:
        """Compute per microbatch per stage (analysis/pipeline/schedule.py)."""
        return self.report.pipeline.stage_imbalance

    def bandwidth(self) -> pd.DataFrame:
        """Every collective instance with transfer, wait, algbw, busbw (analysis/comm/bandwidth_report.py)."""
        return self.report.comm.bandwidth

    def bandwidth_summary(self) -> pd.DataFrame:
        """Per dimension, op and size bucket, with efficiency (analysis/comm/bandwidth_report.py)."""
        return self.report.comm.bandwidth_summary

    def instances(self) -> pd.DataFrame:
        """Every collective and send/recv of every rank, matched (analysis/comm/instances.py)."""
        return self.report.comm.instances

    def collectives(self) -> pd.DataFrame:
        """Per matched collective: arrival skew, holdup, last rank, transfer
        (analysis/comm/matching.py); empty when they cannot be matched (see
        ``summary().cross_rank.why_not``)."""
        return self.report.comm.collectives

    def whatif(self) -> pd.DataFrame:
        """Per rank and step: the step with that rank at its reference pace
        (analysis/crossrank/whatif.py)."""
        return self.report.graph.whatif

    def critical_path(self) -> pd.DataFrame:
        """Each profiled step's critical path (analysis/crossrank/graph.py)."""
        return self.report.graph.critical_path

    def rank_waits(self) -> pd.DataFrame:
        """Per rank: what-if saving, waits suffered and caused (analysis/crossrank/whatif.py)."""
        return self.report.graph.rank_waits

    def straggler(self) -> Straggler | None:
        """The straggler, or None (analysis/crossrank/whatif.py)."""
        return self.report.summary.straggler

    def clock_offsets(self) -> pd.DataFrame:
        """Per rank clock offset, its uncertainty, the applied offset
        (analysis/crossrank/clocks.py)."""
        return self.report.comm.clock_offsets

    def timeline(self) -> pd.DataFrame:
        """The aligned per-rank segments of each step (analysis/timeline/segments.py)."""
        return self.report.steps.timeline

    def step_heatmap(self) -> pd.DataFrame:
        """Per rank × step wall time from the step timers, warm-up and slow steps flagged
        (analysis/records/steps.py)."""
        return self.report.records.step_heatmap

    def throughput(self) -> pd.DataFrame:
        """Per step: step time, tokens/s, MFU (analysis/records/steps.py)."""
        return self.report.records.throughput

    def hangs(self) -> pd.DataFrame:
        """Flight Recorder verdicts (analysis/records/flight_recorder.py)."""
        return self.report.records.flight_recorder

    def memory_steps(self) -> pd.DataFrame:
        """Per rank, device and profiled step: the peaks allocated and reserved, where they
        fall, reserved − allocated at the peak (analysis/memory/steps.py; docs/memory.md)."""
        return self.report.memory.memory_steps

    def memory_devices(self) -> pd.DataFrame:
        """Per rank and device: the largest peaks, growth across steps, the device's memory
        (analysis/memory/rank_memory.py)."""
        return self.report.memory.memory_devices

    def memory_live(self) -> pd.DataFrame:
        """The blocks live at each device's largest peak, by the operator, module and range
        that allocated them (analysis/memory/live.py)."""
        return self.report.memory.memory_live

    def memory_curve(self) -> pd.DataFrame:
        """Allocated and reserved over time, a bounded envelope (analysis/memory/curve.py)."""
        return self.report.memory.memory_curve

    def memory_terms(self) -> pd.DataFrame:
        """Model states measured from the trace and the runner's census
        (analysis/memory/terms.py)."""
        return self.report.memory.memory_terms

    def memory_snapshots(self) -> tuple[pd.DataFrame, pd.DataFrame, list[MemorySnapshot]]:
        """The memory snapshots read: their segments, the blocks live at their largest moment,
        and a summary per device with the out-of-memory record (analysis/memory/snapshot.py)."""
        return (self.report.memory.memory_segments, self.report.memory.memory_snapshot_live,
                list(self.report.summary.memory.snapshots))

    def findings(self) -> list[Finding]:
        """Ranked findings with evidence, cost, remedy and what-if (analysis/report/findings.py)."""
        return list(self.report.summary.findings)


def open(path, **options) -> RunAnalysis:
    """Analyse ``path`` (a run directory or a folder of traces); ``options`` are the fields of
    ``analysis.report.options.AnalysisOptions`` (``baseline``, ``comm_kernel_re``,
    ``rank_regex``, ``cache_dir``, ``layout``, ``rank_order``, ``warmup_steps``, ``budgets``…,
    each documented there); an unknown name is a ``TypeError``."""
    return RunAnalysis(analyze(pathlib.Path(path), **options))
