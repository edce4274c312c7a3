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


def _analysis_compare(index: RunIndex, state: ViewState, entries):
    """The analysis' comparison as a dict (``Comparison.to_dict()``); None where this meshscope
    has no ``analysis.compare``. A sweep folder with its sweep.json is compared as a sweep."""
    try:
        from meshscope.analysis.compare import compare as do_compare
    except ImportError:
        return None
    folder = index.root / state.sweep if state.sweep in index.sweeps else None
    # A whole sweep (its failed runs, its plan) only when every run of it is analysed: the
    # analysis would otherwise analyse the others inside this request.
    if folder is not None and not state.runs and (folder / "sweep.json").is_file() \
            and index.inside(folder) and all(e.analysed for e in index.sweep_runs(state.sweep)):
        return do_compare([folder]).to_dict()
    return do_compare([e.path for e in entries]).to_dict()


def comparison_rows(d: dict) -> tuple[list[str], list[tuple[str, list, str]]]:
    """Run names and (figure, value per run, which end is better) of ``Comparison.to_dict()``
    (its rows come ranked, fastest first)."""
    rows = [r for r in d.get("rows") or [] if isinstance(r, dict)]
    names = [str(r.get("name")) for r in rows]

    def col(key, scale=1.0):
        return [r.get(key) / scale if isinstance(r.get(key), (int, float)) else None
                for r in rows]
    out = [("step time (ms)", col("step_time_us", 1e3), "low"),
           ("tokens/s", col("tokens_per_s"), "high"), ("MFU %", col("mfu_pct"), "high"),
           ("compute (ms, mean over ranks)", col("compute_us", 1e3), "low")]
    dims = sorted({k for r in rows for k in (r.get("exposed_comm_us") or {})})
    exposed = [sum((r.get("exposed_comm_us") or {}).values()) / 1e3 for r in rows]
    out.append(("exposed comm (ms)", exposed, "low"))
    for dim in dims:
        out.append((f"  exposed {dim} (ms)", [(r.get("exposed_comm_us") or {}).get(dim, 0.0)
                                              / 1e3 for r in rows], "low"))
    out += [("bubble (ms)", col("bubble_us", 1e3), "low"),
            ("bubble %", [100 * v if v is not None else None
                          for v in col("bubble_fraction")], "low"),
            ("  theory %", [100 * v if v is not None else None
                            for v in col("theory_bubble_fraction")], "low"),
            ("busbw efficiency %", [100 * v if v is not None else None
                                    for v in col("bandwidth_efficiency")], "high"),
            ("peak memory (MB)", col("peak_memory_bytes", 1e6), "low")]
    predicted = [(r.get("predicted") or {}).get("step_time_us") for r in rows]
    if any(isinstance(p, (int, float)) for p in predicted):
        out.append(("predicted step time (ms)", [p / 1e3 if isinstance(p, (int, float))
                                                  else None for p in predicted], "low"))
    out.append(("top finding", [(r.get("findings") or [{}])[0].get("title", "none")
                                if r.get("findings") else "none" for r in rows], "text"))
    return names, out


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
        known = [(v, j) for j, v in enumerate(vals) if isinstance(v, (int, float))
                 and better != "text"]
        if len(known) >= 2:
            lo, hi_ = min(known), max(known)
            worst = hi_ if better == "low" else lo
            hi.add((i, worst[1] + 1))
            if label.startswith(("compute", "exposed comm", "bubble", "idle")):
                diff = hi_[0] - lo[0]
                if biggest is None or diff > biggest[0]:
                    biggest = (diff, label, names[lo[1]], names[hi_[1]], lo[0], hi_[0])
        body.append([label] + [S.fmt(v, 2) if not isinstance(v, str) else v[:80]
                               for v in vals])
    reason = None
    if biggest is not None:
        diff, label, a, b, va, vb = biggest
        reason = (f"The largest difference in the step's breakdown is {label.strip()}: "
                  f"{vb:.2f} in {b} against {va:.2f} in {a} ({diff:+.2f} ms per step).")
    return S.Table("compare-table", ["figure"] + names, body, highlight=frozenset(hi),
                   caption="Marked: the worse end of each row."), reason


def compare_figure(names, rows) -> go.Figure:
    """Each run's mean step breakdown as one stacked bar, from the compare rows."""
    fig = go.Figure()
    by_label = {label.strip(): vals for label, vals, _ in rows}
    for key, label in (("compute (ms, mean over ranks)", "compute"),
                       ("exposed comm (ms)", "exposed comm"), ("bubble (ms)", "bubble"),
                       ("idle (ms)", "idle")):
        if key in by_label:
            fig.add_bar(name=label, x=names, y=[None if v is None else round(v, 3)
                                                for v in by_label[key]],
                        marker_color=COLOURS.get(label, "#E45756"))
    fig.update_layout(**LAYOUT, barmode="stack", height=380, yaxis_title="ms per step",
                      title="Step breakdown per run (mean over ranks)",
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
        theirs = _analysis_compare(index, state, ready)
    except Exception:
        log.exception("analysis.compare failed; showing the summaries side by side")
        theirs = None
    if theirs is not None and theirs.get("rows"):
        names, rows = comparison_rows(theirs)
        if theirs.get("winner") is not None:
            items.append(S.Note("compare-winner", f"Fastest: {theirs['winner']}."))
        for i, text in enumerate(theirs.get("explanations") or []):
            items.append(S.Note("compare-reason" if i == 0 else f"compare-reason-{i}",
                                str(text)))
        for f in theirs.get("failed") or []:
            items.append(S.Note(f"compare-failed-{f.get('name')}", f"{f.get('name')}: "
                                f"{f.get('status')} — {f.get('error') or ''}", warn=True))
        table, _ = _table(names, rows)
    else:
        rows = summary_rows(reports)
        table, reason = _table(names, rows)
        known = [(v, n) for v, n in zip(rows[0][1], names) if isinstance(v, (int, float))]
        if known:
            items.append(S.Note("compare-winner", f"Fastest: {min(known)[1]} "
                                f"({min(known)[0]:.2f} ms per step)."))
        if reason:
            items.append(S.Note("compare-reason", reason))
        items.append(S.Note("compare-source", "Figures from each run's summary.json (this "
                            "meshscope has no analysis.compare)."))
    items.append(table)
    items.append(S.Figure("compare-graph", compare_figure(names, rows)))
    return [html.H2(["Compare · ", html.Span(" vs ".join(names), id="run-title")])] + \
        S.to_dash([S.Section(None, items)])


def register(app) -> None:
    """The compare page has no callbacks of its own (its runs are in the URL)."""
