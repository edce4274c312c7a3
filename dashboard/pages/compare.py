"""Compare: two or more runs side by side — step time and its breakdown, exposed communication
per dimension, bubble, bandwidth efficiency, findings — the best and worst of each row marked
and the largest difference put in words.

The runs come from the URL (``?run=A&run=B…``) or a whole sweep folder (``?sweep=ID``). The
comparison is the analysis' own (``meshscope.analysis.compare.compare(paths)``, the same as
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

from meshscope.analysis.report import reader
from meshscope.analysis.report.summary import STEP_TIME_SOURCES

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


def _analysis_compare(index: RunIndex, state: ViewState, entries):
    """The analysis' comparison as a dict (``Comparison.to_dict()``), the one comparison of
    meshscope. A sweep folder with its sweep.json is compared as a sweep."""
    from meshscope.analysis.compare import compare as do_compare
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
    out = [("ranks (world size)", [r.get("ranks") for r in rows], "info"),
           ("step time (ms)", col("step_time_us", 1e3), "low"),
           ("  step time from", [reader.SHORT.get(r.get("step_time_source") or "", "-")
                                 for r in rows], "text"),
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


def _table(names, rows) -> S.Table:
    """The compare table: the worse end of each row marked — every run holding it —, nothing
    marked where the runs tie (equal to the shown precision)."""
    body, hi = [], set()
    for i, (label, vals, better) in enumerate(rows):
        known = [(round(v, 2), j) for j, v in enumerate(vals) if isinstance(v, (int, float))
                 and better in ("low", "high")]
        if len(known) >= 2 and min(known)[0] != max(known)[0]:
            worst = max(known)[0] if better == "low" else min(known)[0]
            hi.update((i, j + 1) for v, j in known if v == worst)
        body.append([label] + [S.fmt(v, 2) if not isinstance(v, str) else S.clip(v, 80)
                               for v in vals])
    return S.Table("compare-table", ["figure"] + names, body, highlight=frozenset(hi),
                   caption="Marked: the worse end of each row; a row where the runs are equal "
                           "is a tie and is not marked.")


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
    if theirs.get("winner") is not None:
        items.append(S.Note("compare-winner", f"Fastest: {theirs['winner']}."))
    for i, text in enumerate(theirs.get("explanations") or []):
        items.append(S.Note("compare-reason" if i == 0 else f"compare-reason-{i}", str(text)))
    for f in theirs.get("failed") or []:
        items.append(S.Note(f"compare-failed-{f.get('name')}", f"{f.get('name')}: "
                            f"{f.get('status')} — {f.get('error') or ''}", warn=True))
    sizes = sorted({r.get("ranks") for r in theirs.get("rows") or [] if isinstance(r, dict)
                    and isinstance(r.get("ranks"), int)})
    if len(sizes) > 1:
        items.append(S.Note("compare-world", "These runs have different world sizes ("
                            + ", ".join(map(str, sizes)) + " ranks): step times compare "
                            "layouts of different machines.", warn=True))
    items.append(S.Note("compare-step-source", "Step time: " + STEP_TIME_SOURCES["timer"]
                        + " (the figure the runs list, the overview and `meshscope analyze` "
                        "show), unless the row \"step time from\" says otherwise."))
    table = _table(names, rows)
    items.append(table)
    items.append(S.Figure("compare-graph", compare_figure(names, rows)))
    return [html.H2(["Compare · ", html.Span(" vs ".join(names), id="run-title")])] + \
        S.to_dash([S.Section(None, items)])


def register(app) -> None:
    """The compare page has no callbacks of its own (its runs are in the URL)."""
