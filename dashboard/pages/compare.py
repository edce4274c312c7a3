"""Compare: two or more runs side by side — step time and its breakdown, exposed communication
per dimension, bubble, bandwidth efficiency, findings — the best and worst of each row marked
and the largest difference put in words.

The runs come from the URL (``?run=A&run=B…``) or a whole sweep folder (``?sweep=ID``). The
comparison is the analysis' own (``meshscope.analysis.compare.compare(paths)``, the same as
``meshscope compare``) when this meshscope has it; otherwise the page shows each run's
summary.json figures side by side (``summary_rows``), and says so.

- ``compare-table``: one row per figure, one column per run; ``compare-winner`` and
  ``compare-reason``: which run is fastest and why, in words.
- ``compare-graph``: each run's mean step breakdown (mean over ranks of summary.json's
  ``per_rank_mean``) as one stacked bar.
"""
from __future__ import annotations

import logging

import plotly.graph_objects as go
from dash import html

from .. import sections as S
from ..data import ReportUnreadable, open_report
from ..runs import RunIndex
from ..state import ViewState
from .common import COLOURS, DIMS, LAYOUT, per_rank_mean

log = logging.getLogger("meshscope.dashboard")


def _entries(index: RunIndex, state: ViewState):
    entries = [index.get(r) for r in state.runs]
    entries = [e for e in entries if e is not None]
    if state.sweep:
        entries += [e for e in index.sweep_runs(state.sweep) if e not in entries]
    return entries


def _analysis_compare(entries):
    """The analysis' comparison (``Comparison.to_dict()``), or None where this meshscope has
    no ``analysis.compare``."""
    try:
        from meshscope.analysis.compare import compare as do_compare
    except ImportError:
        return None
    return do_compare([e.path for e in entries]).to_dict()


def summary_rows(reports) -> list[tuple[str, list, str]]:
    """(figure, value per run, "low" or "high" = which is better) from each summary.json."""
    def mean_of(rep, col):
        m = per_rank_mean(rep)
        return float(m[col].mean()) / 1e3 if not m.empty and col in m else None

    def step_ms(rep):
        v = rep.get("step_time_us")
        if not isinstance(v, (int, float)):
            v = rep.get("throughput", "step_time_us")
        if isinstance(v, (int, float)):
            return v / 1e3
        m = per_rank_mean(rep)
        return float(m["window_us"].max()) / 1e3 if not m.empty and "window_us" in m else None

    def worst_bubble(rep):
        st = [s.get("bubble_fraction") for s in rep.get("pipeline_stages", default=[])
              if isinstance(s, dict)]
        st = [x for x in st if isinstance(x, (int, float))]
        return 100 * max(st) if st else None

    def efficiency(rep):
        eff = [b.get("efficiency") for b in rep.get("bandwidth", default=[])
               if isinstance(b, dict)]
        eff = [e for e in eff if isinstance(e, (int, float))]
        return 100 * sorted(eff)[len(eff) // 2] if eff else None

    rows = [("step time (ms)", [step_ms(r) for r in reports], "low"),
            ("tokens/s", [r.get("throughput", "tokens_per_s") for r in reports], "high"),
            ("MFU %", [r.get("throughput", "mfu_pct") for r in reports], "high"),
            ("compute (ms, mean over ranks)", [mean_of(r, "compute_us") for r in reports],
             "low"),
            ("exposed comm (ms)", [mean_of(r, "exposed_comm_us") for r in reports], "low")]
    for d in DIMS:
        vals = [mean_of(r, f"exposed_comm_{d}_us") for r in reports]
        if any(v for v in vals):
            rows.append((f"  exposed {d} (ms)", vals, "low"))
    rows += [("bubble (ms)", [mean_of(r, "bubble_us") for r in reports], "low"),
             ("idle (ms)", [mean_of(r, "idle_us") for r in reports], "low"),
             ("worst stage bubble %", [worst_bubble(r) for r in reports], "low"),
             ("busbw efficiency % (median)", [efficiency(r) for r in reports], "high"),
             ("findings", [len(r.get("findings", default=[])) for r in reports], "low")]
    return rows


def _table(names, rows) -> tuple[S.Table, str | None]:
    body, hi = [], set()
    biggest = None
    for i, (label, vals, better) in enumerate(rows):
        known = [(v, j) for j, v in enumerate(vals) if isinstance(v, (int, float))]
        if len(known) >= 2:
            lo, hi_ = min(known), max(known)
            worst = hi_ if better == "low" else lo
            hi.add((i, worst[1] + 1))
            if label.startswith(("compute", "exposed comm", "bubble", "idle")):
                diff = hi_[0] - lo[0]
                if biggest is None or diff > biggest[0]:
                    biggest = (diff, label, names[lo[1]], names[hi_[1]], lo[0], hi_[0])
        body.append([label] + [S.fmt(v, 2) for v in vals])
    reason = None
    if biggest is not None:
        diff, label, a, b, va, vb = biggest
        reason = (f"The largest difference in the step's breakdown is {label.strip()}: "
                  f"{vb:.2f} in {b} against {va:.2f} in {a} ({diff:+.2f} ms per step).")
    return S.Table("compare-table", ["figure"] + names, body, highlight=frozenset(hi),
                   caption="Marked: the worse end of each row."), reason


def compare_figure(names, reports) -> go.Figure:
    fig = go.Figure()
    segs = [("compute", "compute_us", "overlapped_comm_us"),
            ("overlapped comm", "overlapped_comm_us", None),
            ("exposed comm", "exposed_comm_us", None), ("bubble", "bubble_us", None),
            ("idle", "idle_us", None)]
    for label, col, minus in segs:
        ys = []
        for rep in reports:
            m = per_rank_mean(rep)
            if m.empty or col not in m:
                ys.append(None)
                continue
            v = m[col] - (m[minus] if minus and minus in m else 0.0)
            ys.append(round(float(v.mean()) / 1e3, 3))
        fig.add_bar(name=label, x=names, y=ys, marker_color=COLOURS.get(label, "#E45756"))
    fig.update_layout(**LAYOUT, barmode="stack", height=380, yaxis_title="ms per step",
                      title="Mean step breakdown per run (mean over ranks)",
                      xaxis={"type": "category"})
    return fig


def render(index: RunIndex, state: ViewState) -> list:
    entries = _entries(index, state)
    ready = [e for e in entries if e.analysed]
    if len(ready) < 2:
        return [html.H2("Compare"),
                html.P("Pick two or more analysed runs on the Runs page (tick them, then "
                       "\"compare selected runs\"), or open a sweep.", id="run-message",
                       style=S.NOTE)]
    names = [e.run_id for e in ready]
    try:
        reports = [open_report(e) for e in ready]
    except ReportUnreadable as e:
        log.warning("report unreadable: %s", e)
        return [html.H2("Compare"), html.P("A report is unreadable — run `meshscope analyze` "
                                           "on each run.", id="run-message", style=S.WARN)]
    items: list = []
    try:
        theirs = _analysis_compare(ready)
    except Exception:
        log.exception("analysis.compare failed; showing the summaries side by side")
        theirs = None
    if theirs is not None:
        rows = theirs.get("rows") or []
        cols = list(rows[0]) if rows and isinstance(rows[0], dict) else []
        items.append(S.Table("compare-table", cols, [[S.fmt(r.get(c), 2) for c in cols]
                                                     for r in rows], left=1))
        if theirs.get("winner") is not None:
            items.append(S.Note("compare-winner", f"Fastest: {theirs['winner']}."))
        for i, text in enumerate(theirs.get("explanations") or []):
            items.append(S.Note("compare-reason" if i == 0 else f"compare-reason-{i}",
                                str(text)))
    else:
        table, reason = _table(names, summary_rows(reports))
        steps = summary_rows(reports)[0][1]
        known = [(v, n) for v, n in zip(steps, names) if isinstance(v, (int, float))]
        if known:
            items.append(S.Note("compare-winner", f"Fastest step: {min(known)[1]} "
                                f"({min(known)[0]:.2f} ms)."))
        if reason:
            items.append(S.Note("compare-reason", reason))
        items.append(table)
        items.append(S.Note("compare-source", "Figures from each run's summary.json (this "
                            "meshscope has no analysis.compare)."))
    items.append(S.Figure("compare-graph", compare_figure(names, reports)))
    return [html.H2(["Compare · ", html.Span(" vs ".join(names), id="run-title")])] + \
        S.to_dash([S.Section(None, items)])


def register(app) -> None:
    """The compare page has no callbacks of its own (its runs are in the URL)."""
