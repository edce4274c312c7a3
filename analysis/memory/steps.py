"""Per profiled step and device: the peaks, where they fall, and how memory moves from step to
step — ``report/memory_steps.parquet``.

A step's memory events are those whose time lies in the step's host range [start, end] (the
``ProfilerStep#N`` range, or the ``--step-annotation`` range; a trace without steps is one
step, 0, over its whole span): the allocator works on the host's clock, when the operator
runs, not when its kernel does. Per (rank, device, step) — ``COLUMNS``:

======================== ==================================================================
column                   meaning
======================== ==================================================================
rank, device, step       the rank, ``cuda:0`` / ``cpu`` (``series.device_label``), the step
start_us, end_us         the step's host range, µs on the rank's own clock
events                   memory events in the step
alloc_bytes, free_bytes  bytes allocated and freed in it (both ≥ 0)
start_allocated_bytes    allocated just before the step's first event
end_allocated_bytes      allocated after its last event
peak_allocated_bytes     the largest allocated total after any of its events
peak_allocated_us        when (own clock); the first such event when several reach it
peak_allocated_op        the operator that made that allocation (``operators.context``)
peak_reserved_bytes      the largest reserved total in the step (null where unknown)
peak_reserved_us         when
reserved_at_peak_bytes   reserved at the allocated peak
fragmentation_bytes      reserved − allocated at the allocated peak: memory the caching
                         allocator holds but no tensor uses, when the step needs the most
totals                   ``absolute``, ``since-start`` or ``rebuilt`` (``series.TOTALS``)
======================== ==================================================================

``growth(rows)`` — how a device's memory moves across steps: the end-of-step allocated of each
step after the first, against the step before (``GROWTH``). A leak keeps memory from every
step: each step ends higher than the one before. On a CPU trace the first profiled step's
start is not comparable (its counter starts with the profiler, ``series``), but every step's
end is.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from meshscope.analysis.memory.series import Series

COLUMNS = ["rank", "device", "step", "start_us", "end_us", "events", "alloc_bytes",
           "free_bytes", "start_allocated_bytes", "end_allocated_bytes",
           "peak_allocated_bytes", "peak_allocated_us", "peak_allocated_op",
           "peak_reserved_bytes", "peak_reserved_us", "reserved_at_peak_bytes",
           "fragmentation_bytes", "totals"]


@dataclasses.dataclass(frozen=True)
class StepPeak:
    """Where one step's peaks fall in a ``Series``: event indices (-1: no event)."""
    step: int
    first: int
    last: int
    peak_allocated: int
    peak_reserved: int


def step_peaks(s: Series, host_steps: dict[int, tuple[float, float]]) -> list[StepPeak]:
    """The events of each step (module docstring) and the indices of its peaks; a step with
    no memory event is left out."""
    out = []
    for step, (a, b) in sorted(host_steps.items()):
        lo = int(np.searchsorted(s.ts_us, a, side="left"))
        hi = int(np.searchsorted(s.ts_us, b, side="right"))
        if hi <= lo:
            continue
        pa_ = lo + int(np.argmax(s.allocated[lo:hi]))
        pr = lo + int(np.argmax(s.reserved[lo:hi])) if s.reserved is not None else -1
        out.append(StepPeak(step, lo, hi - 1, pa_, pr))
    return out


def step_rows(rank: int, s: Series, host_steps: dict[int, tuple[float, float]],
              peaks: list[StepPeak], peak_ops: dict[int, str | None]) -> list[dict]:
    """One row per step of ``peaks`` (``COLUMNS``); ``peak_ops``: event index → operator."""
    rows = []
    for p in peaks:
        a, b = host_steps[p.step]
        sl = slice(p.first, p.last + 1)
        size = s.bytes[sl]
        reserved_at = int(s.reserved[p.peak_allocated]) if s.reserved is not None else None
        peak = int(s.allocated[p.peak_allocated])
        rows.append({
            "rank": rank, "device": s.device, "step": p.step, "start_us": float(a),
            "end_us": float(b), "events": int(p.last - p.first + 1),
            "alloc_bytes": int(size[size > 0].sum()), "free_bytes": int(-size[size < 0].sum()),
            "start_allocated_bytes": s.before(p.first),
            "end_allocated_bytes": int(s.allocated[p.last]),
            "peak_allocated_bytes": peak,
            "peak_allocated_us": float(s.ts_us[p.peak_allocated]),
            "peak_allocated_op": peak_ops.get(p.peak_allocated),
            "peak_reserved_bytes": int(s.reserved[p.peak_reserved]) if p.peak_reserved >= 0
            else None,
            "peak_reserved_us": float(s.ts_us[p.peak_reserved]) if p.peak_reserved >= 0
            else None,
            "reserved_at_peak_bytes": reserved_at,
            "fragmentation_bytes": reserved_at - peak if reserved_at is not None else None,
            "totals": s.totals})
    return rows


GROWTH = ["growth_per_step_bytes", "growth_steps", "growth_monotone"]


@dataclasses.dataclass(frozen=True)
class Growth:
    """A device's memory across its profiled steps: ``deltas`` (each step's end-of-step
    allocated less the previous step's), their mean (``per_step_bytes``), and whether every
    one of them is positive (``monotone``). No deltas with fewer than two steps."""
    deltas: list[int]

    @property
    def per_step_bytes(self) -> float | None:
        return float(np.mean(self.deltas)) if self.deltas else None

    @property
    def monotone(self) -> bool:
        return bool(self.deltas) and all(d > 0 for d in self.deltas)


def growth(rows: list[dict]) -> Growth:
    """The growth across the steps of one device's rows (``step_rows``), in step order."""
    ends = [r["end_allocated_bytes"] for r in sorted(rows, key=lambda r: r["step"])]
    return Growth([int(b - a) for a, b in zip(ends, ends[1:])])
