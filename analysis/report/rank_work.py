"""The per-rank stage of the analysis: one trace in, that rank's small tables out.

``rank_work(path, options)`` runs where the trace is read — an ingest worker process, or a
Dask worker — and returns a ``RankResult``: the rank's identity, its timeline's interval sets,
its collective instances and the other per-rank tables the cross-rank stage needs. The event
table itself never leaves the worker, so the cross-rank stage holds small tables only, however
many ranks there are (docs/benchmarks.md measures the memory).
"""
from __future__ import annotations

import dataclasses
import pathlib
import re

import pandas as pd

from meshscope.analysis.comm import bandwidth_report as comm_report
from meshscope.analysis.crossrank import stragglers
from meshscope.analysis.ingest import events as ingest
from meshscope.analysis.ingest import validate
from meshscope.analysis.report.inputs import TraceIdentity, identity
from meshscope.analysis.timeline import breakdown as overlap
from meshscope.analysis.timeline import rank_timeline as timeline


@dataclasses.dataclass(frozen=True)
class RankOptions:
    """What every rank's work needs to know (sent to the workers with each trace)."""
    comm_kernel_re: re.Pattern | None = None
    rank_regex: re.Pattern | None = None
    cache_dir: pathlib.Path | None = None
    run: dict | None = None


@dataclasses.dataclass
class RankResult:
    identity: TraceIdentity
    on_gpu: bool
    timeline: timeline.RankTimeline
    trace_overlap: dict
    collectives: pd.DataFrame
    transfers: pd.DataFrame
    problems: list[str]
    implausible: str | None

    @property
    def rank(self) -> int:
        return self.identity.rank


def rank_work(path: pathlib.Path, opts: RankOptions) -> RankResult:
    """The per-rank stage for the trace at ``path``; InputError when it cannot be read."""
    trace = ingest.load_trace(path, comm_kernel_re=opts.comm_kernel_re,
                              rank_regex=opts.rank_regex, cache_dir=opts.cache_dir)
    tl = timeline.build(trace, opts.run)
    problems = list(getattr(trace, "problems", []) or [])
    return RankResult(
        identity=identity(trace.path, trace.rank, trace.meta), on_gpu=trace.on_gpu,
        timeline=tl, trace_overlap=overlap.trace_overlap(tl),
        collectives=stragglers.rank_collectives(trace, tl, opts.run),
        transfers=comm_report.rank_transfers(trace, tl, opts.run),
        problems=problems, implausible=validate.step_windows_problem(tl.steps, tl.span))
