"""A history of runs, whole: series, trends, change points, what changed at each, the gate.

``review(sides, …) -> Review``; ``text(review)`` and ``to_dict(review)`` for the command, the
agent server and the dashboard.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from meshscope.analysis.compare import diff as compare_diff
from meshscope.analysis.compare import gate
from meshscope.analysis.compare.sides import Side

from . import baseline
from .changes import ChangePoint, change_points
from .series import Series, Trend, split, trends


@dataclasses.dataclass(frozen=True)
class Shift:
    """A run where one or more quantities changed level: the runs either side, the changes,
    and what compare says changed between those two runs."""
    at: int
    before_run: str
    after_run: str
    changes: tuple[ChangePoint, ...]
    sentences: tuple[str, ...]


@dataclasses.dataclass
class Review:
    series: Series
    trends: list[Trend]
    shifts: list[Shift]
    verdicts: list[gate.Verdict]
    others: list[Series]               # the series the runs kept apart make


def shifts_of(runs: list[Side], ts: list[Trend], explain: bool = True) -> list[Shift]:
    """Change points of every trend, grouped by run, each explained by compare's diff of the
    run before it and the run itself."""
    by_run: dict[int, list[ChangePoint]] = {}
    for t in ts:
        for cp in change_points(t):
            by_run.setdefault(cp.at, []).append(cp)
    out = []
    for at in sorted(by_run):
        sentences: tuple[str, ...] = ()
        if explain:
            sentences = tuple(compare_diff(runs[at - 1], runs[at]).sentences)
        out.append(Shift(at, runs[at - 1].name, runs[at].name, tuple(by_run[at]), sentences))
    return out


def review(sides: list[Side], *, quantities: list[str] | None = None,
           conditions: Sequence[gate.Condition] = (), baseline_runs: int = baseline.DEFAULT_RUNS,
           allow_unmeasured: bool = False, explain: bool = True,
           across: tuple[str, ...] = ()) -> Review:
    """The history of ``sides`` (already in order): its longest series reviewed, the others
    listed (``across``: the differences a series may span, ``series.ACROSS``). GateError as
    compare's gate for a condition that cannot be judged."""
    all_series = split(sides, across)
    main = all_series[0]
    ts = trends(main.runs, quantities)
    verdicts = [baseline.evaluate(c, main.runs, baseline_runs, allow_unmeasured)
                for c in conditions]
    return Review(main, ts, shifts_of(main.runs, ts, explain), verdicts, all_series[1:])


def _fmt(unit: str, x: float | None) -> str:
    from meshscope.analysis.compare.gate import _fmt as fmt
    return fmt(unit, x)


def text(r: Review) -> str:
    runs = r.series.runs
    lines = [f"series of {len(runs)} comparable run(s): {runs[0].name} … {runs[-1].name}"]
    for name, why in r.series.kept_apart:
        lines.append(f"  kept apart: {name} ({'; '.join(why)})")
    lines.append("")
    for t in r.trends:
        known = [v for v in t.values if v is not None]
        lines.append(f"{t.name:<28} first {_fmt(t.unit, known[0])}  last "
                     f"{_fmt(t.unit, known[-1])}  ({len(known)} runs)")
    lines.append("")
    if not r.shifts:
        lines.append("no change point: every quantity stayed within its noise")
    for s in r.shifts:
        lines.append(f"change at run {s.at + 1} ({s.after_run}, after {s.before_run}):")
        for cp in s.changes:
            rel = f" ({cp.rel:+.1%})" if cp.rel is not None else ""
            lines.append(f"  {cp.quantity}: {_fmt(cp.unit, cp.before)} → "
                         f"{_fmt(cp.unit, cp.after)}{rel}, noise ±{_fmt(cp.unit, cp.sigma)}")
        lines += [f"  · {x}" for x in s.sentences[:4]]
    if r.verdicts:
        lines.append("")
        lines += [f"gate: {v.message}" for v in r.verdicts]
    return "\n".join(lines)


def to_dict(r: Review) -> dict:
    runs = r.series.runs
    return {
        "series": [{"name": s.name, "report": str(s.report_dir)} for s in runs],
        "kept_apart": [{"name": n, "why": w} for n, w in r.series.kept_apart],
        "trends": [{"quantity": t.name, "unit": t.unit, "values": list(t.values),
                    "noises": list(t.noises)} for t in r.trends],
        "change_points": [{"run": s.at, "name": s.after_run, "before_run": s.before_run,
                           "changes": [{"quantity": c.quantity, "unit": c.unit,
                                        "before": c.before, "after": c.after,
                                        "sigma": c.sigma} for c in s.changes],
                           "what_changed": list(s.sentences)} for s in r.shifts],
        "gate": [{"condition": v.condition.text, "failed": v.failed, "checked": v.checked,
                  "measured": v.measured, "noise": v.noise, "message": v.message}
                 for v in r.verdicts],
    }
