"""One rank's memory tables, made where its trace is read (``analysis/report/rank_work.py``).

``rank_tables(trace, host_steps)`` splits the trace's ``[memory]`` events by device
(``series``) and returns the rank's rows of the report's memory tables:

- ``memory_steps`` — per device and profiled step (``steps.COLUMNS``);
- ``memory_devices`` — per device, the run of its steps in one row (``DEVICE_COLUMNS``): the
  largest peaks and the step, operator and module they fall at, reserved − allocated there,
  the growth across steps and the device's memory where the trace says it;
- ``memory_live`` — the blocks live at the device's largest allocated peak, grouped by the
  operator, module and user range that allocated them and the phase of the step they were
  made in (``LIVE_COLUMNS``; a runner microbatch range without its microbatch, so the blocks of
  every microbatch in flight are one group; the ``TOP_LIVE`` largest groups, then one
  ``(other)`` row). ``phase`` (``vocabulary.MemoryPhase``): ``backward`` where the autograd
  engine ran a backward function (or a runner backward range), ``optimizer`` inside the
  optimizer's step or zero_grad, ``forward`` inside a module or a forward range, else none
  (made in the step itself: the batch, a buffer, a workspace);
- ``memory_curve`` — the bounded series (``curve.COLUMNS``);
- ``memory_terms`` — the model states the trace shows (``terms.COLUMNS``).

Only small tables leave the worker; the memory events themselves stay there.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from meshscope.analysis.memory import curve, operators, series, steps, terms
from meshscope.analysis.memory.live import BEFORE_TRACE, live_at, pairs
from meshscope.collectors import annotations

DEVICE_COLUMNS = ["rank", "device", "totals", "events", "steps", "peak_allocated_bytes",
                  "peak_step", "peak_us", "peak_op", "peak_module", "peak_annotation",
                  "peak_reserved_bytes", "reserved_at_peak_bytes", "fragmentation_bytes",
                  "growth_per_step_bytes", "growth_steps", "growth_monotone",
                  "device_total_bytes", "device_total_source"]
LIVE_COLUMNS = ["rank", "device", "step", "operator", "module", "annotation", "phase",
                "bytes", "blocks", "share"]
OPTIMIZER_NOTE = re.compile(r"^Optimizer\.|optimizer", re.IGNORECASE)
TOP_LIVE = 30
OTHER = "(other)"


def rank_tables(rank: int, memory: pd.DataFrame, events: pd.DataFrame, meta: dict,
                host_steps: dict[int, tuple[float, float]]) -> dict[str, pd.DataFrame]:
    """The rank's rows of every memory table (module docstring); empty tables (with their
    columns) for a trace without ``[memory]`` events."""
    out: dict[str, list] = {"memory_steps": [], "memory_devices": [], "memory_live": [],
                            "memory_terms": []}
    curves = []
    for s in series.split(memory):
        peaks = steps.step_peaks(s, host_steps)
        if not peaks:
            continue
        freed_by = pairs(s)
        # The operator of every step's peak event, and of the blocks live at the largest one.
        live = {p.step: live_at(s, p.peak_allocated, freed_by) for p in peaks}
        top = max(peaks, key=lambda p: (s.allocated[p.peak_allocated], -p.step))
        queries = np.unique(np.concatenate([[p.peak_allocated for p in peaks],
                                            live[top.step].index]).astype(np.int64))
        ops, mods, notes = operators.context(events, s.lane[queries], s.ts_us[queries])
        op_of = dict(zip(queries.tolist(), ops))
        mod_of = dict(zip(queries.tolist(), mods))
        note_of = dict(zip(queries.tolist(), notes))
        backward = operators.in_backward(events, s.lane[queries], s.ts_us[queries])
        phase_of = {q: phase(mods[i], notes[i], bool(backward[i]))
                    for i, q in enumerate(queries.tolist())}
        rows = steps.step_rows(rank, s, host_steps, peaks, op_of)
        out["memory_steps"] += rows
        g = steps.growth(rows)
        top_row = next(r for r in rows if r["step"] == top.step)
        reserved = [r["peak_reserved_bytes"] for r in rows if r["peak_reserved_bytes"] is not None]
        total = series.device_memory_bytes(meta, s)
        out["memory_devices"].append({
            "rank": rank, "device": s.device, "totals": s.totals, "events": len(s),
            "steps": len(rows), "peak_allocated_bytes": top_row["peak_allocated_bytes"],
            "peak_step": top.step, "peak_us": top_row["peak_allocated_us"],
            "peak_op": op_of.get(top.peak_allocated), "peak_module": mod_of.get(top.peak_allocated),
            "peak_annotation": note_of.get(top.peak_allocated),
            "peak_reserved_bytes": max(reserved) if reserved else None,
            "reserved_at_peak_bytes": top_row["reserved_at_peak_bytes"],
            "fragmentation_bytes": top_row["fragmentation_bytes"],
            "growth_per_step_bytes": g.per_step_bytes, "growth_steps": len(g.deltas),
            "growth_monotone": g.monotone, "device_total_bytes": total,
            "device_total_source": "trace" if total is not None else None})
        out["memory_live"] += live_rows(rank, s, top.step, live[top.step], op_of, mod_of,
                                        note_of, phase_of, top_row["peak_allocated_bytes"])
        out["memory_terms"] += terms.event_terms(
            rank, s, events, peaks, {k: v.index for k, v in live.items()})
        out["memory_terms"] += terms.census_terms(rank, s.device, meta)
        curves.append(curve.curve_rows(rank, s, host_steps))
    return {
        "memory_steps": pd.DataFrame(out["memory_steps"], columns=steps.COLUMNS),
        "memory_devices": pd.DataFrame(out["memory_devices"], columns=DEVICE_COLUMNS),
        "memory_live": pd.DataFrame(out["memory_live"], columns=LIVE_COLUMNS),
        "memory_curve": pd.concat([pd.DataFrame(c) for c in curves], ignore_index=True)[
            curve.COLUMNS] if curves else pd.DataFrame(columns=curve.COLUMNS),
        "memory_terms": pd.DataFrame(out["memory_terms"], columns=terms.COLUMNS),
    }


def phase(module: str | None, note: str | None, in_backward: bool) -> str | None:
    """The phase of the step a block was made in (module docstring): backward, optimizer,
    forward, or None."""
    mb = annotations.parse_microbatch(note) if note else None
    if in_backward or (mb is not None and mb["phase"] == "backward"):
        return "backward"
    if note and OPTIMIZER_NOTE.search(note):
        return "optimizer"
    if module or (mb is not None and mb["phase"] == "forward") or \
            (note and "forward" in note.lower()):
        return "forward"
    return None


def live_rows(rank: int, s: series.Series, step: int, live, op_of: dict, mod_of: dict,
              note_of: dict, phase_of: dict, peak: int) -> list[dict]:
    """The live blocks at one peak grouped by (operator, module, annotation, phase), largest first:
    ``TOP_LIVE`` groups, the rest as one ``(other)`` row, and the bytes live at the peak that
    the trace never saw allocated as ``(before the trace)``."""
    groups: dict[tuple, list[int]] = {}
    for i in live.index.tolist():
        key = (op_of.get(i), mod_of.get(i), _group(note_of.get(i)), phase_of.get(i))
        g = groups.setdefault(key, [0, 0])
        g[0] += int(s.bytes[i])
        g[1] += 1
    ranked = sorted(groups.items(), key=lambda kv: (-kv[1][0], str(kv[0])))
    rows = []
    for (op, mod, note, ph), (nbytes, blocks) in ranked[:TOP_LIVE]:
        rows.append(_live(rank, s, step, op or "(no operator)", mod, note, ph, nbytes, blocks,
                          peak))
    rest = ranked[TOP_LIVE:]
    if rest:
        rows.append(_live(rank, s, step, OTHER, None, None, None, sum(v[0] for _, v in rest),
                          sum(v[1] for _, v in rest), peak))
    if live.before_bytes:
        rows.append(_live(rank, s, step, BEFORE_TRACE, None, None, None, live.before_bytes,
                          None, peak))
    return rows


def _group(note: str | None) -> str | None:
    """A user range without the number of its instance: a runner microbatch range without its
    microbatch (``meshscope/forward stage=0``), a step without its number (``ProfilerStep``),
    so that the blocks of every microbatch in flight, or kept by every step, are one group."""
    mb = annotations.parse_microbatch(note) if note else None
    if mb:
        return f"{annotations.PREFIX}{mb['phase']} stage={mb['stage']}"
    if note and annotations.STEP_RE.match(note):
        return "ProfilerStep"
    return note


def _live(rank, s, step, op, mod, note, ph, nbytes, blocks, peak) -> dict:
    return {"rank": rank, "device": s.device, "step": step, "operator": op, "module": mod,
            "annotation": note, "phase": ph, "bytes": int(nbytes), "blocks": blocks,
            "share": nbytes / peak if peak > 0 else None}
