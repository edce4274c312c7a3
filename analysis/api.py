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

from meshscope.analysis.report.analyze import Report, analyze


class RunAnalysis:
    def __init__(self, report: Report):
        self.report = report

    def __repr__(self) -> str:
        return (f"RunAnalysis({str(self.report.source)!r}, ranks={self.report.ranks}, "
                f"findings={len(self.report.findings)})")

    def summary(self) -> dict:
        """What summary.json holds."""
        return self.report.summary()

    def breakdown(self) -> pd.DataFrame:
        """Per rank and step: compute/comm/overlap/bubble/idle (analysis/overlap.py)."""
        return self.report.breakdown

    def trace_overlap(self) -> pd.DataFrame:
        """Per rank, whole-trace overlap as HTA computes it (analysis/overlap.py)."""
        return self.report.trace_overlap

    def bubbles(self) -> pd.DataFrame:
        """Per pipeline stage and step: bubble, theory, replay (analysis/bubble.py)."""
        return self.report.bubbles

    def microbatches(self) -> pd.DataFrame:
        """Microbatch timeline (analysis/pipeline_report.py)."""
        return self.report.microbatches

    def pipeline_phases(self) -> pd.DataFrame:
        """Warm-up / steady / cool-down per rank and step (analysis/pipeline_report.py)."""
        return self.report.pipeline_phases

    def stage_imbalance(self) -> pd.DataFrame:
        """Compute per microbatch per stage (analysis/pipeline_report.py)."""
        return self.report.stage_imbalance

    def bandwidth(self) -> pd.DataFrame:
        """Every collective instance with transfer, wait, algbw, busbw (analysis/comm_report.py)."""
        return self.report.bandwidth

    def bandwidth_summary(self) -> pd.DataFrame:
        """Per dimension, op and size bucket, with efficiency (analysis/comm_report.py)."""
        return self.report.bandwidth_summary

    def collectives(self) -> pd.DataFrame | None:
        """Matched instances: skew, holdup, last rank (analysis/stragglers.py); None when the
        collectives cannot be matched (see ``summary()['cross_rank']['why_not']``)."""
        return self.report.collectives

    def rank_waits(self) -> pd.DataFrame | None:
        """Per rank: last arrivals, wait caused, wait suffered (analysis/stragglers.py)."""
        return self.report.rank_waits

    def clock_offsets(self) -> pd.DataFrame:
        """Per rank clock offset and its uncertainty (analysis/stragglers.py)."""
        return self.report.clock_offsets

    def step_heatmap(self) -> pd.DataFrame:
        """Per rank × step wall time from the step timers, slow steps flagged."""
        return self.report.step_heatmap

    def hangs(self) -> pd.DataFrame | None:
        """Flight Recorder verdicts (analysis/hangs.py); None without comms/."""
        return self.report.hangs

    def findings(self) -> list[dict]:
        """Ranked findings with evidence, remedy and what-if (analysis/findings.py)."""
        return self.report.findings


def open(path, *, baseline: pd.DataFrame | None = None, comm_kernel_re: str | None = None,
         rank_regex: str | None = None, cache_dir: pathlib.Path | None = None) -> RunAnalysis:
    """Analyse ``path`` (a run directory or a folder of traces)."""
    return RunAnalysis(analyze(pathlib.Path(path), baseline=baseline,
                               comm_kernel_re=comm_kernel_re, rank_regex=rank_regex,
                               cache_dir=cache_dir))
