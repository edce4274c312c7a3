"""Plausibility of what a trace says, checked once per rank before any figure uses it.

Three layers, each with one rule per kind of damage (docs/damaged-input.md):

- **Events** (``event_bounds``): after each event's fields have been typed (``batch_columns.py``
  drops an event whose name is not a string or whose ``ts`` / ``dur`` is missing, not a number,
  not finite, or a negative duration), the trace as a whole decides which timestamps and
  durations are impossible. The *bulk* of the trace is the range of its events' start times
  between the 1st and the 99th percentile; a start farther from the bulk than
  ``OUTLIER_FACTOR`` times its length (at least ``MIN_TRACE_US``) lies outside the trace's span.
  The trace's *end* is the latest end of the events whose duration fits within the spread of
  start times (so one absurd duration cannot stretch it); an event that would end more than
  the trace's own length (at least ``MIN_TRACE_US``) after that is longer than the trace. Both
  are dropped and counted. Real traces (the whole shared corpus, every sample) have none.
- **Damage records** (``Damage``): what ingest dropped or ignored, by field and reason,
  written as one problem line per kind (``lines``): the file, the field, how many events, why.
  A rank that loses more than ``MAX_DROPPED_SHARE`` of its events is not analysed: its numbers
  would be computed from a trace the analysis knows to be damaged.
- **Metadata** (``trace_meta``): the top-level keys the analysis reads (``distributedInfo``'s
  rank, world size and process groups, ``baseTimeNanoseconds``, meshscope's run id) are typed
  and bounded; a value that is not usable is removed, with a problem line, so that nothing
  later reads it.

``step_windows_problem(steps, span)`` — why a rank's profiled-step windows cannot be used for
cross-rank figures (None when they can): a window that is not finite, has no positive length,
lies outside the trace's own time span, lasts longer than ``MAX_STEP_US``, or overlaps the next
step's window (steps run one after another on a rank). Such a rank keeps its per-rank numbers
where they make sense and is left out of the cross-rank ones (pipeline windows, waits, the
straggler), with the reason in the report's problems.
"""
from __future__ import annotations

import collections
import json
import math

import numpy as np

from meshscope.collectors.run_info import MAX_WORLD_SIZE
from meshscope.collectors.schema import short

MAX_STEP_US = 24 * 3600 * 1e6      # a profiled training step longer than a day is not one
MIN_TRACE_US = 60e6                # a trace may always span a minute, whatever its events say
OUTLIER_FACTOR = 10.0              # a start this many bulk lengths away is outside the trace
MAX_DROPPED_SHARE = 0.05           # a rank losing more of its events than this is not analysed
STEP_OVERLAP_TOLERANCE = 0.01      # of the shorter window: rounding, not overlap
INT64_MAX = 2**63 - 1

DROPPED, IGNORED, LOST = "dropped", "ignored", "lost"
STEP_PREFIX = "ProfilerStep#"


class Damage(collections.Counter):
    """(field, action, why) → number of events; ``action`` is ``dropped`` (the event is not in
    the table) or ``ignored`` (the event is, without that field's value). Metadata damage has
    a count of 0: it concerns the file, not its events."""

    def drop(self, field: str, why: str, n: int = 1) -> None:
        if n:
            self[(field, DROPPED, why)] += n

    def ignore(self, field: str, why: str, n: int = 1) -> None:
        if n:
            self[(field, IGNORED, why)] += n

    def lose_steps(self, names, cats, dropped, why: str) -> None:
        """Name each step whose ``ProfilerStep#N`` host range is among the ``dropped`` events
        (a mask over ``names`` / ``cats``), so that the step's absence has a line of its own:
        the event is counted once, under its field; this says which step went with it."""
        for i in np.flatnonzero(dropped):
            name, cat = names[i], cats[i]
            if type(name) is str and name.startswith(STEP_PREFIX) \
                    and cat != "gpu_user_annotation":
                self[(name, LOST, why)] += 1

    def note(self, field: str, why: str) -> None:
        """Damage of the file's metadata (no event count)."""
        self[(field, IGNORED, why)] += 0

    @property
    def dropped(self) -> int:
        return sum(n for (_, action, _), n in self.items() if action == DROPPED)

    def summary(self, most: int = 3) -> str:
        """The commonest reasons events were dropped, in a few words each."""
        drops = sorted(((n, f, w) for (f, a, w), n in self.items() if a == DROPPED),
                       reverse=True)
        return "; ".join(f"{f}: {w} ({n:,} event{'s' * (n != 1)})" for n, f, w in drops[:most])

    def to_json(self) -> bytes:
        return json.dumps([[f, a, w, n] for (f, a, w), n in sorted(self.items())]).encode()

    @classmethod
    def from_json(cls, text: bytes | None) -> "Damage":
        out = cls()
        for f, a, w, n in json.loads(text) if text else []:
            out[(f, a, w)] += n
        return out

    def lines(self, path) -> list[str]:
        """One problem line per kind of damage, most events first."""
        out = []
        for (field, action, why), n in sorted(self.items(), key=lambda kv: (-kv[1], kv[0])):
            if action == DROPPED:
                out.append(f"{path}: {field}: {n:,} event{'s' * (n != 1)} dropped ({why})")
            elif action == LOST:
                out.append(f"{path}: {field} dropped ({why}): that step is missing from "
                           f"this rank's figures")
            elif n:
                out.append(f"{path}: {field}: ignored in {n:,} event{'s' * (n != 1)} ({why})")
            else:
                out.append(f"{path}: {field}: ignored ({why})")
        return out


def event_bounds(ts: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, Damage]:
    """Which events (finite ``ts`` / non-negative ``dur``, µs) lie within the trace's span and
    last no longer than the trace (module docstring): the mask of those to keep, and what was
    dropped."""
    damage = Damage()
    n = len(ts)
    if n == 0:
        return np.ones(0, dtype=bool), damage
    lo, hi = np.quantile(ts, [0.01, 0.99])
    reach = max(OUTLIER_FACTOR * (hi - lo), MIN_TRACE_US)
    inside = (ts >= lo - reach) & (ts <= hi + reach)
    damage.drop("ts", "a start time outside the trace's span", int(n - inside.sum()))
    t, d = ts[inside], dur[inside]
    t0, t1 = float(t.min()), float(t.max())
    fits = d <= t1 - t0
    end = max(t1, float((t[fits] + d[fits]).max())) if fits.any() else t1
    length = max(end - t0, MIN_TRACE_US)
    too_long = inside & (ts + dur > end + length)
    damage.drop("dur", "a duration longer than the trace", int(too_long.sum()))
    return inside & ~too_long, damage


def instants_within(ts: np.ndarray, event_ts: np.ndarray) -> np.ndarray:
    """Which instants (the ``[memory]`` events' times, µs) lie within the span of the trace's
    complete events (their start times ``event_ts``, already kept by ``event_bounds``), by
    ``event_bounds``' rule: no farther from the bulk of the starts than ``OUTLIER_FACTOR``
    times its length (at least ``MIN_TRACE_US``)."""
    if len(ts) == 0:
        return np.ones(0, dtype=bool)
    if len(event_ts) == 0:
        return np.zeros(len(ts), dtype=bool)
    lo, hi = np.quantile(event_ts, [0.01, 0.99])
    reach = max(OUTLIER_FACTOR * (hi - lo), MIN_TRACE_US)
    return (ts >= lo - reach) & (ts <= hi + reach)


def step_windows_problem(steps: dict[int, tuple[float, float]],
                         span: tuple[float, float]) -> str | None:
    lo, hi = span
    previous = None
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
        if previous is not None:
            p_step, p_start, p_end = previous
            shorter = min(p_end - p_start, end - start)
            if start < p_end - STEP_OVERLAP_TOLERANCE * shorter:
                return (f"ProfilerStep#{step} starts {(p_end - start) / 1e3:.3g} ms before "
                        f"ProfilerStep#{p_step} ends (a rank runs its steps one after another)")
        previous = (step, start, end)
    return None


# -- metadata --------------------------------------------------------------------------------

def _is_int(v, lo: int, hi: int) -> bool:
    return type(v) is int and lo <= v <= hi


def _show(v) -> str:
    """A scalar as the messages of ``collectors.schema`` quote it; a container by its type."""
    return short(v) if isinstance(v, (str, int, float, bool, type(None))) else type(v).__name__


def trace_meta(meta: dict) -> tuple[dict, list[str]]:
    """The trace metadata with every value the analysis reads typed and bounded, and one line
    (``field: problem``) per value removed. ``distributedInfo.rank`` must be an integer from 0
    below ``distributedInfo.world_size`` (itself 1 … ``MAX_WORLD_SIZE``); a process group of
    ``pg_config`` must list its ranks as such integers; ``baseTimeNanoseconds`` an integer from
    0 to 2⁶³−1; meshscope's ``run_id`` a string."""
    meta = dict(meta)
    out: list[str] = []
    info = meta.get("distributedInfo")
    if info is not None and not isinstance(info, dict):
        out.append(f"distributedInfo: expected an object, got {_show(info)}; ignored")
        meta.pop("distributedInfo")
    elif isinstance(info, dict):
        info = meta["distributedInfo"] = dict(info)
        world = info.get("world_size")
        if world is not None and not _is_int(world, 1, MAX_WORLD_SIZE):
            out.append(f"distributedInfo.world_size: {_show(world)} is not a world size (an "
                       f"integer from 1 to {MAX_WORLD_SIZE}); ignored")
            info.pop("world_size")
            world = None
        rank = info.get("rank")
        top = (world or MAX_WORLD_SIZE) - 1
        if rank is not None and not _is_int(rank, 0, top):
            out.append(f"distributedInfo.rank: {_show(rank)} is not a rank (an integer from 0 "
                       f"to {top}); ignored, the rank comes from the file name")
            info.pop("rank")
        groups = info.get("pg_config")
        if groups is not None:
            if not isinstance(groups, list):
                out.append(f"distributedInfo.pg_config: expected a list, got {_show(groups)}; "
                           f"ignored")
                info.pop("pg_config")
            else:
                good = [g for g in groups if isinstance(g, dict)
                        and isinstance(g.get("ranks"), list)
                        and all(_is_int(r, 0, MAX_WORLD_SIZE - 1) for r in g["ranks"])
                        and isinstance(g.get("pg_name", ""), (str, int))
                        and not isinstance(g.get("pg_name", ""), bool)]
                if len(good) < len(groups):
                    out.append(f"distributedInfo.pg_config: {len(groups) - len(good)} of "
                               f"{len(groups)} process groups without a list of ranks "
                               f"(integers from 0); ignored")
                    info["pg_config"] = good
    base = meta.get("baseTimeNanoseconds")
    if base is not None and not _is_int(base, 0, INT64_MAX):
        out.append(f"baseTimeNanoseconds: {_show(base)} is not an integer from 0 to 2^63-1; "
                   f"ignored")
        meta.pop("baseTimeNanoseconds")
    mine = meta.get("meshscope")
    if mine is not None and (not isinstance(mine, dict) or not isinstance(
            mine.get("run_id", ""), str)):
        out.append("meshscope: expected an object with a string run_id; ignored")
        meta.pop("meshscope")
    return meta, out


def info_rank(meta: dict) -> int | None:
    """``distributedInfo.rank`` of metadata checked by ``trace_meta`` (None when absent)."""
    info = meta.get("distributedInfo")
    return info.get("rank") if isinstance(info, dict) else None


def info_world_size(meta: dict) -> int | None:
    info = meta.get("distributedInfo")
    return info.get("world_size") if isinstance(info, dict) else None


def run_id(meta: dict) -> str | None:
    mine = meta.get("meshscope")
    return mine.get("run_id") if isinstance(mine, dict) else None
