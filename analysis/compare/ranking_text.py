"""The terminal table of runs side by side, ranked (``meshscope compare`` of three or more
runs, ``meshscope sweep``): ``render(comparison)`` — one row per run, fastest first, ties
marked ``1=``, the sweep's failed runs under it, then the explanations and the predicted vs
measured ranking; ``detail`` adds under each row every number the planner predicts beside the
measured one. The comparison itself is ``ranking.rank``.
"""
from __future__ import annotations

from meshscope.vocabulary import COMM_DIMS, STEP_TIME_SOURCES

from .ranking import TIE_REL, Comparison, RunRow


def _cell(x, width: int, fmt: str, scale: float = 1.0, suffix: str = "") -> str:
    text = "-" if x is None else format(x / scale, fmt) + suffix
    return text.rjust(width)


def _beside(row: RunRow) -> list[str]:
    """``measured / planned`` for every number the planner predicts, one line each; none
    for a run without run.json (anyone's traces: its terms, with why one is not measured,
    are ``layouts.job_vs_plan``'s block under the table)."""
    p = row.predicted
    if p is None or row.layout is None:
        return []

    def pair(label, meas, plan, scale, unit):
        m = "-" if meas is None else f"{meas / scale:.1f}"
        q = "-" if plan is None else f"{plan / scale:.1f}"
        return f"{label} {m} / {q} {unit}"

    items = [pair("step", row.step_time_us, p.step_time_us, 1e3, "ms"),
             pair("compute", row.compute_us, p.compute_us, 1e3, "ms")]
    for d in sorted(set(row.exposed_comm_us) | set(p.exposed_comm_us)):
        items.append(pair(f"exposed {d}", row.exposed_comm_us.get(d),
                          p.exposed_comm_us.get(d), 1e3, "ms"))
    if row.bubble_fraction is not None or p.bubble_fraction is not None:
        items.append(pair("bubble", row.bubble_fraction, p.bubble_fraction, 0.01, "%"))
    items.append(pair("peak memory", row.peak_memory_bytes, p.peak_memory_bytes, 1e6, "MB"))
    for d in sorted(set(row.comm_bytes) | set(p.comm_bytes)):
        items.append(pair(f"{d} bytes", row.comm_bytes.get(d), p.comm_bytes.get(d), 1e3,
                          "KB"))
    return [f"     measured / planned: {'; '.join(items)}"]


def render(c: Comparison, detail: bool = False) -> str:
    """The terminal table of ``meshscope compare``; ``detail`` adds under each row every
    number the planner predicts beside the measured one."""
    dims = [d for d in COMM_DIMS if any(d in r.exposed_comm_us for r in c.rows)]
    head = (f"{'#':>2} {'run':<26} {'ranks':>5} {'step ms':>9} {'plan ms':>8} {'tokens/s':>9} {'MFU':>5} "
            f"{'compute':>8} " + " ".join(f"{'exp ' + d:>8}" for d in dims)
            + f" {'bubble':>6} {'bw eff':>6} {'peak MB':>8} {'plan MB':>8}")
    lines = [head]
    ties = c.ties
    for i, r in enumerate(c.rows, 1):
        pred = r.predicted
        place = "1=" if r in ties else f"{i:>2}"
        bubble = r.bubble_fraction * 100 if r.bubble_fraction is not None else None
        lines.append(" ".join([
            f"{place:>2}", f"{r.name[:26]:<26}", f"{r.ranks:>5}",
            _cell(r.step_time_us, 9, ".1f", 1e3) + ("" if r.step_time_source in (None, "timer")
                                                    else "*"),
            _cell(pred.step_time_us if pred else None, 8, ".1f", 1e3),
            _cell(r.tokens_per_s, 9, ".0f"), _cell(r.mfu_pct, 5, ".1f"),
            _cell(r.compute_us, 8, ".1f", 1e3),
            *(_cell(r.exposed_comm_us.get(d), 8, ".1f", 1e3) for d in dims),
            _cell(bubble, 6, ".0f", suffix="%"), _cell(r.bandwidth_efficiency, 6, ".2f"),
            _cell(r.peak_memory_bytes, 8, ".0f", 1e6),
            _cell(pred.peak_memory_bytes if pred else None, 8, ".1f", 1e6)]))
        if detail:
            lines += _beside(r)
    lines.append("(times per step in ms; ranks = world size; exp = exposed communication; "
                 "plan = the planner's prediction; peak MB = the step timers' peak: CPU "
                 "resident set)")
    if ties:
        lines.append(f"(1= : a step time within {TIE_REL:.1%} of the winner's, a tie)")
    lines.append(f"(step ms = {STEP_TIME_SOURCES['timer']}"
                 + ("; * = a run without step timers: "
                    + ", ".join(sorted({STEP_TIME_SOURCES[r.step_time_source] for r in c.rows
                                        if r.step_time_source not in (None, "timer")}))
                    if any(r.step_time_source not in (None, "timer") for r in c.rows) else "")
                 + ")")
    for f_ in c.failed:
        lines.append(f"   {f_.name}: {f_.status}" + (f" — {f_.error}" if f_.error else ""))
    if c.explanations:
        lines.append("")
        lines += [f"- {e}" for e in c.explanations]
    if c.rank_correlation is not None:
        lines.append(f"\npredicted vs measured ranking: Spearman ρ = {c.rank_correlation:.2f}")
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines)
