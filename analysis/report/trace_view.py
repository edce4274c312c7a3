"""One rank's traced events in one step, by name — what the Timeline's trace view draws
(issue 51 item 4), read for a report from its run's trace files.

The report keeps the timeline as segments (``timeline.parquet``), not every event: the names a
user hovers over, the lanes of every CPU thread and GPU stream and the launch → kernel flows
are read here from the rank's own trace (through the analysis' parquet cache where it left
one, ``ReportDir.cache``), moved onto the report's step axis — the rank's applied clock offset
(``clocks.to_aligned_us``), less the step's anchor (the table's ``step_start_us``) — and cut to
the step (``named_lanes.named_events``). Like ``reader``, this is the report side's answer to
a page: the dashboard draws what it returns and derives nothing itself.

``step_events`` returns the ``named_lanes.NamedEvents`` or, where there are none to draw, why
(a sentence for the page's note): the traces cannot be listed, none of them is the rank's, the
rank's trace is larger than ``TRACE_BYTES_LIMIT`` on disk.
"""
from __future__ import annotations

import pathlib

from meshscope.analysis.crossrank import clocks
from meshscope.analysis.errors import InputError
from meshscope.analysis.ingest.events import RankTrace, load_trace
from meshscope.analysis.ingest.rank_naming import name_rank
from meshscope.analysis.report.inputs import find_traces
from meshscope.analysis.timeline import named_lanes
from meshscope.analysis.timeline.named_lanes import (MAX_EVENTS, NamedEvents, lane_label,
                                                     lane_order)
from meshscope.collectors import run_dir as rd

__all__ = ["MAX_EVENTS", "NamedEvents", "TRACE_BYTES_LIMIT", "lane_label", "lane_order",
           "step_events"]

TRACE_BYTES_LIMIT = 256 << 20   # a trace file larger than this is not read for the view
CANDIDATES = 16                 # files tried in turn when no file name gives the rank


def rank_trace_file(path: pathlib.Path, rank: int) -> pathlib.Path | None:
    """The trace file of ``rank`` among the run's: the one whose name gives that rank, else
    the only one; None when neither settles it (the caller then reads them in turn)."""
    files = find_traces(path)
    named = [f for f in files if name_rank(f) == rank]
    if len(named) == 1:
        return named[0]
    return files[0] if len(files) == 1 else None


def load_rank(run: pathlib.Path, report_dir: pathlib.Path, rank: int) -> RankTrace | str:
    """The rank's trace (``load_trace``, through the report's parquet cache when the analysis
    left one), or why it is not read."""
    try:
        found = rank_trace_file(run, rank)
        candidates = [found] if found is not None else find_traces(run)[:CANDIDATES]
    except (InputError, OSError, ValueError) as e:
        return f"its traces cannot be listed ({e})"
    cache = rd.ReportDir(report_dir).cache
    failures = []
    for f in candidates:
        try:
            if f.stat().st_size > TRACE_BYTES_LIMIT:
                return (f"its trace {f.name} is larger than {TRACE_BYTES_LIMIT >> 20} MiB, "
                        f"more than this view reads")
            tr = load_trace(f, cache_dir=cache if cache.is_dir() else None)
        except (InputError, OSError) as e:
            failures.append(f"{f.name}: {e}")
            continue
        if tr.rank == rank:
            return tr
    tail = f" ({'; '.join(failures[:2])})" if failures else ""
    return f"no trace of rank {rank} could be read{tail}"


def step_events(run: pathlib.Path, report_dir: pathlib.Path, rank: int, *,
                applied_offset_us: float, step_start_us: float | None,
                end_us: float) -> NamedEvents | str:
    """The named events and launch flows of ``rank`` on the step's axis, cut to [0,
    ``end_us``) (module docstring), or why there are none. ``applied_offset_us`` is the
    rank's applied clock offset (``reader.clock_offsets``), ``step_start_us`` the step's
    anchor in the timeline table (None: an older report without it)."""
    if step_start_us is None:
        return "the report's timeline table has no step anchor (re-run `meshscope analyze`)"
    tr = load_rank(run, report_dir, rank)
    if isinstance(tr, str):
        return tr
    # event time on the step's axis = aligned time − the step's start
    shift = -clocks.to_aligned_us(0.0, applied_offset_us) + step_start_us
    return named_lanes.named_events(tr.events, 0.0, end_us, shift_us=shift)
