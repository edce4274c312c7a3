"""The per-rank stage of the analysis: one trace in, that rank's small tables out.

``rank_work(path, options)`` runs where the trace is read — an ingest worker process, or a
Dask worker — and returns a ``RankResult``: the rank's identity, its timeline (interval sets,
step windows, microbatch spans, wait regions), the operations the trace shows
(``analysis.comm.instances.extract``: the instance table's rows before the cross-rank stage
joins them to the Flight Recorder and gives them groups and dimensions), its whole-trace
overlap and the problems met. The event table itself never leaves the worker, so the
cross-rank stage holds small tables only, however many ranks there are.
"""
from __future__ import annotations

import dataclasses
import pathlib
import re

import pandas as pd

from meshscope.analysis.comm import instances
from meshscope.analysis.ingest import events as ingest
from meshscope.analysis.ingest import validate
from meshscope.analysis.report.inputs import TraceIdentity, identity
from meshscope.analysis.timeline import breakdown
from meshscope.analysis.timeline import rank_timeline as timeline


@dataclasses.dataclass(frozen=True)
class RankOptions:
    """What every rank's work needs to know (sent to the workers with each trace)."""
    comm_kernel_re: re.Pattern | None = None
    rank_regex: re.Pattern | None = None
    cache_dir: pathlib.Path | None = None


@dataclasses.dataclass
class RankResult:
    identity: TraceIdentity
    on_gpu: bool
    # The cross-rank stage sets ``timeline`` and ``operations`` to None once it has replaced
    # them (the aligned timeline, the instance table), so they are not held twice.
    timeline: timeline.RankTimeline | None
    trace_overlap: dict
    operations: pd.DataFrame | None  # instances.RAW_COLUMNS
    meta: dict                      # instances.small_meta of the trace
    problems: list[str]
    implausible: str | None

    @property
    def rank(self) -> int:
        return self.identity.rank


def rank_work(path: pathlib.Path, opts: RankOptions) -> RankResult:
    """The per-rank stage for the trace at ``path``; InputError when it cannot be read."""
    trace = ingest.load_trace(path, comm_kernel_re=opts.comm_kernel_re,
                              rank_regex=opts.rank_regex, cache_dir=opts.cache_dir)
    tl = timeline.build(trace)
    return RankResult(
        identity=identity(trace.path, trace.rank, trace.meta), on_gpu=tl.on_gpu, timeline=tl,
        trace_overlap=breakdown.trace_overlap(tl),
        operations=instances.extract(trace, tl.on_gpu),
        meta=instances.small_meta(trace.meta),
        problems=list(getattr(trace, "problems", []) or []),
        implausible=validate.step_windows_problem(tl.steps, tl.span))
