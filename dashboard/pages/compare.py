"""Compare: two or more runs side by side — step time and its breakdown, exposed communication
per dimension, bubble, bandwidth efficiency, findings — the best and worst of each row marked
and the largest difference put in words.

The runs come from the URL (``?run=A&run=B…``) or a whole sweep folder (``?sweep=ID``). The
comparison is the analysis' own (``meshscope.layouts.compare.compare(paths)``, the same as
``meshscope compare``): there is no second one here. Each run's world size is a row (and a
warning when they differ); the step time is the one every page shows, with its source.

- ``compare-table``: one row per figure, one column per run; ``compare-winner`` and
  ``compare-reason``: which run is fastest and why, in words.
- ``compare-graph``: the table's step time, compute, exposed communication and bubble as
  grouped bars (the same numbers as the table).
"""
from __future__ import annotations

import logging

import plotly.graph_objects as go
from dash import html

from meshscope.analysis.compare.ranking import TIE_REL, Comparison, worse_end
from meshscope.vocabulary import COMM_DIMS, STEP_TIME_SOURCES
from meshscope.layouts.ranked import compare as do_compare
from meshscope.analysis.report import reader

from .. import sections as S
from ..runs import RunIndex
from ..state import ViewState
from .common import COLOURS, LAYOUT

log = logging.getLogger("meshscope.dashboard")


def _entries(index: RunIndex, state: ViewState):
    entries = [index.get(r) for r in state.runs]
    entries = [e for e in entries if e is not None]
    if state.sweep:
        entries += [e for e in index.sweep_runs(state.sweep) if e not in entries]
    return entries


def _analysis_compare(index: RunIndex, state: ViewState, entries) -> Comparison:
    """The analysis' comparison, the one comparison of meshscope. A sweep folder with its
    sweep.json is compared as a sweep."""
    folder = index.root / state.sweep if state.sweep in index.sweeps else None
    # A whole sweep (its failed runs, its plan) only when every run of it is analysed: the
    # analysis would otherwise analyse the others inside this request.
    if folder is not None and not state.runs and (folder / "sweep.json").is_file() \
            and index.inside(folder) and all(e.analysed for e in index.sweep_runs(state.sweep)):
        return do_compare([folder])
    return do_compare([e.path for e in entries])


def _ms(us):
    return None if us is None else us / 1e3


def _pct(fraction):
    return None if fraction is None else 100 * fraction


def comparison_rows(c: Comparison) -> tuple[list[str], list[tuple[str, list, str]]]:
    """Run names and (figure, value per run, which end is better) of a ``Comparison`` (its
    rows come ranked, fastest first): every value is a ``RunRow`` field as compare holds it."""
    rows = c.rows
    names = [r.name for r in rows]
    out = [("ranks (world size)", [r.ranks for r in rows], "info"),
           ("step time (ms)", [_ms(r.step_time_us) for r in rows], "low"),
           ("  step time from", [reader.SHORT.get(r.step_time_source or "", "-")
                                 for r in rows], "text"),
           ("tokens/s", [r.tokens_per_s for r in rows], "high"),
           ("MFU %", [r.mfu_pct for r in rows], "high"),
           ("compute (ms, mean over ranks)", [_ms(r.compute_us) for r in rows], "low")]
    dims = [d for d in COMM_DIMS if any(d in r.exposed_comm_us for r in rows)]
    out.append(("exposed comm (ms)", [_ms(r.exposed_total_us) for r in rows], "low"))
    for dim in dims:
        out.append((f"  exposed {dim} (ms)", [_ms(r.exposed_comm_us.get(dim, 0.0))
                                              for r in rows], "low"))
    out += [("bubble (ms)", [_ms(r.bubble_us) for r in rows], "low"),
            ("bubble %", [_pct(r.bubble_fraction) for r in rows], "low"),
            ("  theory %", [_pct(r.theory_bubble_fraction) for r in rows], "low"),
            ("busbw efficiency %", [_pct(r.bandwidth_efficiency) for r in rows], "high"),
            ("peak memory (MB)", [None if r.peak_memory_bytes is None
                                  else r.peak_memory_bytes / 1e6 for r in rows], "low")]
    predicted = [r.predicted.step_time_us if r.predicted else None for r in rows]
    if any(p is not None for p in predicted):
        out.append(("predicted step time (ms)", [_ms(p) for p in predicted], "low"))
    out.append(("top finding", [r.findings[0].title if r.findings else "none"
                                for r in rows], "text"))
    return names, out


# Rows shown with other than two decimals (a count, a rate in the thousands).
DIGITS = {"tokens/s": 0}


def _table(names, rows) -> S.Table:
    """The compare table: the worse end of each row marked — every run tied with it —,
    nothing marked where the best and the worst tie (``layouts.compare.worse_end``: within
    0.5%, ``TIE_REL``)."""
    body, hi = [], set()
    for i, (label, vals, better) in enumerate(rows):
        hi.update((i, j + 1) for j in worse_end(vals, better))
        digits = DIGITS.get(label, 2)
        body.append([label] + [S.fmt(v, digits) if not isinstance(v, str) else
                               S.Cell(S.clip(v, 80), v) for v in vals])
    return S.Table("compare-table", ["figure"] + names, body, highlight=frozenset(hi),
                   caption=f"Marked: the worse end of each row. Values within {TIE_REL:.1%} "
                           "of each other are a tie: a row whose best and worst tie is not "
                           "marked.")


def compare_figure(names, rows) -> go.Figure:
    """The table's own figures as bars, side by side per run (grouped, not stacked: compute,
    exposed communication and bubble overlap in time and do not add up to the step)."""
    fig = go.Figure()
    by_label = {label.strip(): vals for label, vals, _ in rows}
    for key, label, colour in (("step time (ms)", "step time", "#333333"),
                               ("compute (ms, mean over ranks)", "compute", COLOURS["compute"]),
                               ("exposed comm (ms)", "exposed comm", COLOURS["comm"]),
                               ("bubble (ms)", "bubble", COLOURS["bubble"])):
        if key in by_label:
            fig.add_bar(name=label, x=names, y=[None if v is None else round(v, 2)
                                                for v in by_label[key]],
                        marker_color=colour,
                        hovertemplate=f"%{{x}}<br>{label}: %{{y:.2f}} ms<extra></extra>")
    fig.update_layout(**LAYOUT, barmode="group", height=380, yaxis_title="ms per step",
                      title="The table's times per run", xaxis={"type": "category"})
    return fig


def render(index: RunIndex, state: ViewState) -> list:
    entries = _entries(index, state)
    ready = [e for e in entries if e.analysed]
    if len(ready) < 2:
        return [html.H2("Compare"),
                html.P("Pick two or more analysed runs on the Runs page (tick them, then "
                       "\"compare selected runs\"), or open a sweep.", id="run-message",
                       style=S.NOTE)]
    try:
        theirs = _analysis_compare(index, state, ready)
    except (OSError, ValueError, KeyError) as e:   # CompareError is a ValueError
        log.warning("compare failed: %s", e)
        return [html.H2("Compare"), html.P("These runs cannot be compared — run "
                                           "`meshscope compare` on them for the reason.",
                                           id="run-message", style=S.WARN)]
    items: list = []
    names, rows = comparison_rows(theirs)
    if theirs.winner is not None:
        tied = [r.name for r in theirs.ties]
        items.append(S.Note("compare-winner", f"Fastest: {theirs.winner.name}"
                            + (f" — tied (within {TIE_REL:.1%}) with " + ", ".join(tied)
                               if tied else "") + "."))
    for i, text in enumerate(theirs.explanations):
        items.append(S.Note("compare-reason" if i == 0 else f"compare-reason-{i}", text))
    for f in theirs.failed:
        items.append(S.Note(f"compare-failed-{f.name}",
                            f"{f.name}: {f.status} — {f.error or ''}", warn=True))
    sizes = sorted({r.ranks for r in theirs.rows})
    if len(sizes) > 1:
        items.append(S.Note("compare-world", "These runs have different world sizes ("
                            + ", ".join(map(str, sizes)) + " ranks): step times compare "
                            "layouts of different machines.", warn=True))
    items.append(S.Note("compare-step-source", "Step time is the "
                        + STEP_TIME_SOURCES["timer"] + ", the figure the runs list, the "
                        "overview and `meshscope analyze` show (unless the row \"step time "
                        "from\" says otherwise)."))
    table = _table(names, rows)
    items.append(table)
    items.append(S.Figure("compare-graph", compare_figure(names, rows)))
    return [html.H2(["Compare · ", html.Span(" vs ".join(names), id="run-title")])] + \
        S.to_dash([S.Section(None, items)])


def register(app) -> None:
    """The compare page has no callbacks of its own (its runs are in the URL)."""
