"""Plausibility of what a trace says, checked once per rank before any figure uses it.

``step_windows_problem(steps, span)`` — why a rank's profiled-step windows cannot be used for
cross-rank figures (None when they can): a window that is not finite, has no positive length,
lies outside the trace's own time span, or lasts longer than ``MAX_STEP_US``. Such a rank keeps
its per-rank numbers where they make sense and is left out of the cross-rank ones (pipeline
windows, waits, the straggler), with the reason in the report's problems.
"""
from __future__ import annotations

import math

MAX_STEP_US = 24 * 3600 * 1e6      # a profiled training step longer than a day is not one


def step_windows_problem(steps: dict[int, tuple[float, float]],
                         span: tuple[float, float]) -> str | None:
    lo, hi = span
    for step, (start, end) in sorted(steps.items()):
        if not (math.isfinite(start) and math.isfinite(end)):
            return f"ProfilerStep#{step} has a non-finite start or end"
        if end <= start:
            return f"ProfilerStep#{step} has no positive duration ({end - start:.3g} µs)"
        if end - start > MAX_STEP_US:
            return (f"ProfilerStep#{step} lasts {(end - start) / 1e6:.3g} s, longer than any "
                    f"training step")
        if start < lo or end > hi:
            return f"ProfilerStep#{step} lies outside the trace's own events"
    return None
