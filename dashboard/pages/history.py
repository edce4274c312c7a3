"""History: a series of comparable runs — each quantity's trend with its noise band, the change
points marked, a click on one opens the compare of the runs on either side (issue 50 item 3).

The runs come from the URL as on the compare page (``?run=A&run=B…``, ``?sweep=ID``) — with
none, or one, every analysed run of the dashboard's folder (one run: the series holding it) —
and ``?quantity=NAME`` picks the quantity drawn (compare's names; ``step_time`` by default),
so the address shares the view. Every number is the history's own
(``meshscope.history.review``: compare's comparability, compare's quantities and their
noise, PELT's change points, compare's diff at each): nothing is computed here, and a report
is only read.

- ``history-series``: how many runs, the first and the last; ``history-kept-apart``: the runs
  kept out of the series and why;
- ``history-quantities``: a link per quantity the runs measure;
- ``history-trend``: the quantity per run (in the series' order), a band of ± its
  step-to-step noise, each change point a red marker and a dotted line; clicking a point opens
  the compare of that run and the one before it;
- ``history-changes``: each change point — the run, the quantities that moved, the link to
  the compare of the runs either side, and compare's sentences;
- ``history-runs``: the series' runs, sortable and filterable as the Runs page's table.
"""
from __future__ import annotations

import logging

import plotly.graph_objects as go
from dash import Input, Output, html

from meshscope.analysis.compare import CompareError, Side, open_side
from meshscope.analysis.compare import quantities as Q
from meshscope.history.review import Review, review
from meshscope.history.series import HistoryError, ordered

from .. import sections as S
from ..runs import RunIndex
from ..state import ViewState
from .common import LAYOUT

log = logging.getLogger("meshscope.dashboard")

DEFAULT_QUANTITY = "step_time"
_SCALE = {Q.US: (1e-3, "ms"), Q.BYTES: (1 / (1 << 20), "MiB"), Q.GBPS: (1.0, "GB/s"),
          Q.PCT: (1.0, "%"), Q.RATE: (1.0, "1/s")}


def _entries(index: RunIndex, state: ViewState):
    chosen = [index.get(r) for r in state.runs]
    chosen = [e for e in chosen if e is not None]
    if state.sweep:
        chosen += [e for e in index.sweep_runs(state.sweep) if e not in chosen]
    if len(chosen) >= 2:
        return chosen
    index.refresh()
    return list(index.runs.values())


def _sides(entries) -> list[Side]:
    out = []
    for e in entries:
        if not e.analysed:
            continue
        try:
            out.append(open_side(e.report_dir, name=e.run_id))
        except CompareError as err:          # an unreadable report is left out and said
            log.warning("history: %s", err)
    return out


def _series_of(sides: list[Side], state: ViewState) -> Review:
    """The longest series of ``sides``; with one run in the URL, the series holding it."""
    r = review(ordered(sides, "start"))
    if len(state.runs) == 1 and state.run not in r.series.names:
        theirs = next((o for o in r.others if state.run in o.names), None)
        if theirs is not None and len(theirs.runs) >= 2:
            r = review(theirs.runs)
    return r


def _trend_figure(r: Review, quantity: str, state: ViewState) -> S.Item:
    t = next((t for t in r.trends if t.name == quantity), None)
    if t is None:
        return S.Note("history-trend", f"No run of this series measures {quantity}.")
    scale, unit = _SCALE.get(t.unit, (1.0, t.unit))
    names = r.series.names
    x = list(range(1, len(names) + 1))
    y = [None if v is None else v * scale for v in t.values]
    noise = [None if n is None else n * scale for n in t.noises]
    upper = [None if v is None or n is None else v + n for v, n in zip(y, noise)]
    lower = [None if v is None or n is None else v - n for v, n in zip(y, noise)]
    links = [ViewState(page="compare", runs=(names[i - 1], names[i])).href() if i else ""
             for i in range(len(names))]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=upper, mode="lines", line={"width": 0},
                             hoverinfo="skip", showlegend=False))
    fig.add_trace(go.Scatter(x=x, y=lower, mode="lines", line={"width": 0},
                             fill="tonexty", fillcolor="rgba(76,120,168,0.18)",
                             name="± step-to-step noise", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=quantity,
                             line={"color": "#4C78A8"}, customdata=links, text=names,
                             hovertemplate="%{text}: %{y:.3f} " + unit + "<extra></extra>"))
    points = [cp for s in r.shifts for cp in s.changes if cp.quantity == quantity]
    if points:
        fig.add_trace(go.Scatter(
            x=[cp.at + 1 for cp in points], y=[y[cp.at] for cp in points],
            mode="markers", name="change point", customdata=[links[cp.at] for cp in points],
            text=[names[cp.at] for cp in points],
            marker={"color": "#E45756", "size": 13, "symbol": "diamond"},
            hovertemplate="change at %{text}: click to compare with the run before"
                          "<extra></extra>"))
        for cp in points:
            fig.add_vline(x=cp.at + 0.5, line={"color": "#E45756", "dash": "dot"})
    fig.update_layout(**LAYOUT, height=380, xaxis_title="run (in order)",
                      yaxis_title=f"{quantity} ({unit})", hovermode="closest",
                      legend={"orientation": "h", "y": 1.08})
    fig.update_xaxes(tickmode="array", tickvals=x, ticktext=names if len(x) <= 40 else None)
    return S.Figure("history-trend", fig, caption=(
        "Each run's value and a band of ± its step-to-step noise; a red diamond is a change "
        "point (PELT, its penalty from the runs' noise: docs/history.md). Click a run to "
        "compare it with the run before it."))


def _changes(r: Review) -> S.Section:
    items: list[S.Item] = []
    if not r.shifts:
        items.append(S.Note("history-no-change", "No change point: every quantity stayed "
                                                 "within its noise over these runs."))
    for i, s in enumerate(r.shifts):
        moved = ", ".join(f"{c.quantity} {c.rel:+.1%}" if c.rel is not None else c.quantity
                          for c in s.changes)
        items.append(S.Link(f"history-change-{i}", f"compare {s.before_run} → {s.after_run}",
                            ViewState(page="compare", runs=(s.before_run, s.after_run)).href(),
                            before=f"At {s.after_run} (run {s.at + 1}): {moved}. "))
        for j, line in enumerate(s.sentences[:3]):
            items.append(S.Note(f"history-change-{i}-{j}", line))
    return S.Section("Change points", items, id="history-changes")


def sections(index: RunIndex, state: ViewState) -> list[S.Section]:
    quantity = state.quantity or DEFAULT_QUANTITY
    sides = _sides(_entries(index, state))
    if len(sides) < 2:
        return [S.Section("History", [S.Note(
            "history-none", "A history needs two analysed runs or more in this folder "
                            "(`meshscope analyze RUN` each, or open them once here).")])]
    try:
        r = _series_of(sides, state)
    except (HistoryError, CompareError, OSError, ValueError, KeyError) as e:
        log.warning("history failed: %s", e)
        return [S.Section("History", [S.Note(
            "history-failed", "These runs cannot make a history — run `meshscope history` "
                              "on them for the reason.", warn=True)])]
    except Exception:                      # an error in meshscope: logged, said, not raised
        log.exception("history of %s", ", ".join(s.name for s in sides))
        return [S.Section("History", [S.Note(
            "history-failed", "The history of these runs cannot be drawn: an error in "
                              "meshscope (the server log has it; please report it).",
            warn=True)])]
    names = r.series.names
    head: list[S.Item] = [S.Facts("history-series", [
        ("comparable runs", len(names)), ("first", names[0]), ("last", names[-1]),
        ("change points", len(r.shifts))])]
    if r.series.kept_apart:
        head.append(S.Table("history-kept-apart", ["run kept apart", "why"],
                            [[n, "; ".join(w)] for n, w in r.series.kept_apart]))
    picks: list[S.Item] = [S.Link(f"history-q-{t.name.replace('.', '-')}", t.name,
                                  state.href("history", quantity=t.name),
                                  before="▸ " if t.name == quantity else "")
                           for t in r.trends]
    rows = [{"position": i + 1, "run": s.name,
             "layout": s.layout or "", "start": (s.info.start_time if s.info else "") or "",
             "step_time_ms": None if s.summary.step_time_us is None
             else s.summary.step_time_us / 1e3} for i, s in enumerate(r.series.runs)]
    grid = S.Grid("history-runs", [("#", "position", "number"), ("run", "run", "text"),
                                   ("layout", "layout", "text"), ("start", "start", "text"),
                                   ("step time (ms)", "step_time_ms", "number")], rows,
                  caption="The series' runs, in order (sort and filter as on the Runs page).")
    return [S.Section("History", head, id="history-head"),
            S.Section("Quantity", picks, id="history-quantities"),
            S.Section(None, [_trend_figure(r, quantity, state)]),
            _changes(r), S.Section("Runs of the series", [grid])]


def render(index: RunIndex, state: ViewState) -> list:
    return [html.H2("History")] + S.to_dash(sections(index, state))


#: A click on a point of the trend opens the compare of that run and the one before it.
OPEN_COMPARE = """
function(click) {
    if (!click || !click.points || !click.points.length) { return window.dash_clientside.no_update; }
    const href = click.points[0].customdata;
    if (href) { window.location.assign(href); }
    return window.dash_clientside.no_update;
}
"""


def register(app) -> None:
    app.clientside_callback(OPEN_COMPARE, Output("history-trend", "className"),
                            Input("history-trend", "clickData"), prevent_initial_call=True)
